//! A randomized, deterministic test of the store (in the spirit of
//! simulation testing): a seeded generator drives one model name through
//! sequences of events, and after every event checks the invariants.
//!
//! Events: transfers of three versions of a model (some files shared, some
//! of the same size with other bytes, one extra), streamed drafts from an
//! honest source and from a lying one (other bytes, an id that is another
//! version's root or another draft's id), announcements, seals, chunk
//! writes (some corrupt), bytes an intake node fetched itself kept in a
//! draft (some corrupt, in pieces spread over later events, going on after
//! their transfer ended and another began), checkpoints, finishes, ends,
//! process crashes at any point (the transfer is dropped; what the kernel
//! has stays), files changed behind the store's back, and removals.
//!
//! Invariants, checked after every event:
//! 1. **A complete record vouches only for matching bytes**: for every file
//!    of a complete record, either its bytes hash to the record's hash, or
//!    the gate's stamp check ([`ModelRecord::changed`]) refuses it; and a
//!    file nobody changed behind the store's back always matches.
//! 2. **Held means verified**: every chunk a manifest's transfer holds reads
//!    back to the manifest's hash (a draft's: to the announced hash, once
//!    announced), whatever the journal or an earlier transfer left.
//! 3. **A finish is what was sent**: `finish` returns the root of what the
//!    source sent and the tree verifies against it.
//! 4. **Nothing outside the root is touched**, and only `<name>` and `.xfer`
//!    appear in it.
//! 5. **A resumed transfer ends with the source's root**: each sequence
//!    ends with an honest transfer run to completion.
//!
//! A failing sequence prints its seed; `XFER_STORE_SEED=<seed>` replays it.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::*;
use xfer_proto::draft::{Draft, DraftEvent};
use xfer_proto::manifest::{file, MANIFEST_VERSION};

const CS: u64 = hash::MIN_CHUNK_SIZE;
const SEQUENCES: u64 = 1500;
const STEPS: usize = 40;

use crate::util::seeded::Rng;

/// One version of the model: files (sorted by path) and their bytes.
#[derive(Clone)]
struct Version {
    files: Vec<(String, Vec<u8>)>,
}

impl Version {
    fn manifest(&self) -> Arc<Manifest> {
        let m = Manifest {
            version: MANIFEST_VERSION,
            chunk_size: CS,
            entries: self.files.iter().map(|(p, d)| file(p, d, CS)).collect(),
        };
        m.validate().unwrap();
        Arc::new(m)
    }

    fn listing(&self) -> Vec<(RelPath, u64)> {
        self.files
            .iter()
            .map(|(p, d)| (RelPath::new(p).unwrap(), d.len() as u64))
            .collect()
    }

    /// The same shape with other bytes in every file (a lying source).
    fn forged(&self, rng: &mut Rng) -> Version {
        Version {
            files: self
                .files
                .iter()
                .map(|(p, d)| (p.clone(), rng.bytes(d.len())))
                .collect(),
        }
    }
}

fn versions() -> Vec<Version> {
    let mut rng = Rng(7);
    let a = rng.bytes(2 * CS as usize + 5000);
    let b = rng.bytes(100);
    let c = rng.bytes(CS as usize);
    let v0 = Version {
        files: vec![
            ("a.bin".into(), a.clone()),
            ("b.json".into(), b.clone()),
            ("sub/c.bin".into(), c.clone()),
        ],
    };
    // Same paths and sizes, other bytes in a.bin; an extra file.
    let v1 = Version {
        files: vec![
            ("a.bin".into(), rng.bytes(a.len())),
            ("b.json".into(), b.clone()),
            ("d.bin".into(), rng.bytes(CS as usize + 300)),
            ("sub/c.bin".into(), c),
        ],
    };
    // a.bin shared with v0, b.json changed at the same size, c gone.
    let v2 = Version {
        files: vec![("a.bin".into(), a), ("b.json".into(), rng.bytes(b.len()))],
    };
    vec![v0, v1, v2]
}

/// What is being received now.
struct Active {
    t: Arc<Transfer>,
    /// The bytes the source sends, file by file (in manifest order).
    content: Version,
    /// For a draft: whether each file's hashes were announced.
    announced: Option<Vec<bool>>,
}

struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    store: Store,
    name: ModelName,
    versions: Vec<Version>,
    active: Option<Active>,
    /// An intake range being kept, and its bytes still to come: it may
    /// outlive its transfer's end (not a crash, which ends everything).
    intake: Option<(fetched::Fetched, Vec<u8>)>,
    /// Files changed behind the store's back since the record was written.
    tampered: BTreeSet<String>,
    log: Vec<String>,
}

fn scratch() -> tempfile::TempDir {
    // tmpfs where there is one: the store fsyncs a lot, and the page cache
    // is all a process crash keeps anyway.
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

impl World {
    fn new() -> World {
        let dir = scratch();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("canary"), b"untouched").unwrap();
        let store = Store::open(&root).unwrap();
        World {
            _dir: dir,
            root,
            outside,
            store,
            name: ModelName::new("m").unwrap(),
            versions: versions(),
            active: None,
            intake: None,
            tampered: BTreeSet::new(),
            log: Vec::new(),
        }
    }

    fn step(&mut self, rng: &mut Rng) {
        let roll = rng.below(100);
        if self.active.is_none() {
            match roll {
                0..=9 if self.intake.is_some() => self.keep(rng),
                0..=29 => self.begin_manifest(rng),
                30..=54 => self.begin_draft(rng),
                55..=69 => self.tamper(rng),
                70..=74 => self.remove(),
                _ => self.begin_manifest(rng),
            }
            return;
        }
        match roll {
            0..=44 => self.write(rng),
            45..=54 => self.keep(rng),
            55..=64 => self.announce_or_seal(rng),
            65..=71 => self.commit(),
            72..=79 => self.finish(),
            80..=87 => self.end(),
            _ => self.crash(),
        }
    }

    fn begin_manifest(&mut self, rng: &mut Rng) {
        let v = rng.below(self.versions.len() as u64) as usize;
        self.log.push(format!("begin manifest v{v}"));
        let content = self.versions[v].clone();
        let t = Arc::new(self.store.begin(&self.name, content.manifest()).unwrap());
        self.active = Some(Active {
            t,
            content,
            announced: None,
        });
    }

    fn begin_draft(&mut self, rng: &mut Rng) {
        let v = rng.below(self.versions.len() as u64) as usize;
        let honest = rng.chance(50);
        let real = &self.versions[v];
        let draft = Draft::new(CS, real.listing()).unwrap();
        let (content, id) = if honest {
            (real.clone(), draft.id(&format!("v{v}")))
        } else {
            // A liar picks an id the receiver may know: a version's root or
            // another draft's id.
            let w = rng.below(self.versions.len() as u64) as usize;
            let id = match rng.chance(50) {
                true => self.versions[w].manifest().root(),
                false => Draft::new(CS, self.versions[w].listing())
                    .unwrap()
                    .id(&format!("v{w}")),
            };
            (real.forged(rng), id)
        };
        self.log.push(format!(
            "begin draft v{v} {} id {}",
            if honest { "honest" } else { "lying" },
            id.short()
        ));
        let n = content.files.len();
        let t = Arc::new(self.store.begin_draft(&self.name, id, draft).unwrap());
        self.active = Some(Active {
            t,
            content,
            announced: Some(vec![false; n]),
        });
    }

    fn write(&mut self, rng: &mut Rng) {
        let a = self.active.as_ref().unwrap();
        let held = a.t.held();
        let missing: Vec<u64> = (0..a.t.map().len())
            .filter(|&c| !held.contains(c))
            .collect();
        if missing.is_empty() {
            return;
        }
        let num = missing[rng.below(missing.len() as u64) as usize];
        let id = a.t.map().id(num);
        let data = &a.content.files[id.file as usize].1;
        let start = a.t.map().offset(id) as usize;
        let mut bytes = data[start..start + a.t.map().chunk_len(id) as usize].to_vec();
        let corrupt = rng.chance(10);
        if corrupt {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 0x5a;
        }
        self.log.push(format!("write {id:?} corrupt={corrupt}"));
        match a.t.write_chunk(id, &bytes) {
            Ok(_) => assert!(!corrupt, "a corrupt chunk was stored"),
            Err(ChunkError::Corrupt(_)) => {
                // Only a corrupt chunk, or a draft's chunk against a
                // trusted copy's announced hash, fails its check.
                assert!(corrupt || a.announced.is_some(), "a good chunk was refused");
            }
            Err(ChunkError::Unannounced(_)) => assert!(a.announced.is_some()),
            Err(ChunkError::Refused(e)) => panic!("write refused: {e}"),
        }
    }

    fn announce_or_seal(&mut self, rng: &mut Rng) {
        let a = self.active.as_mut().unwrap();
        let Some(announced) = a.announced.as_mut() else {
            return;
        };
        let file = rng.below(announced.len() as u64) as u32;
        let ev = if !announced[file as usize] {
            let data = &a.content.files[file as usize].1;
            let count = hash::chunk_count(data.len() as u64, CS);
            let hashes = (0..count)
                .map(|i| {
                    let s = (i * CS) as usize;
                    let e = (s + CS as usize).min(data.len());
                    hash::hash_chunk(&data[s..e], i, count, CS)
                })
                .collect();
            announced[file as usize] = true;
            DraftEvent::Hashed {
                file,
                generation: 0,
                first: 0,
                hashes,
            }
        } else {
            DraftEvent::Sealed {
                file,
                generation: 0,
            }
        };
        self.log
            .push(format!("draft event {ev:?}").chars().take(80).collect());
        if let Err(e) = a.t.apply_draft(&ev) {
            // Sealing a file twice is refused; nothing else may be.
            assert!(matches!(ev, DraftEvent::Sealed { .. }), "{e}");
        }
    }

    /// Bytes this node fetched itself for a striped pull: a new range of
    /// the active draft's (the source's bytes, sometimes with one flipped),
    /// or the next pieces of the range under way, whatever became of its
    /// transfer since.
    fn keep(&mut self, rng: &mut Rng) {
        if self.intake.is_none() {
            let Some(a) = self.active.as_ref().filter(|a| a.announced.is_some()) else {
                return;
            };
            let f = rng.below(a.content.files.len() as u64) as usize;
            let data = &a.content.files[f].1;
            let from = rng.below(data.len() as u64) as usize;
            let to = from + 1 + rng.below((data.len() - from) as u64) as usize;
            let mut bytes = data[from..to].to_vec();
            let corrupt = rng.chance(50);
            if corrupt {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes[i] ^= 0x77;
            }
            self.log
                .push(format!("keep file {f} {from}..{to} corrupt={corrupt}"));
            let w =
                a.t.keep_fetched(f as u32, from as u64)
                    .expect("in the file");
            self.intake = Some((w, bytes));
        }
        let (w, rest) = self.intake.as_mut().unwrap();
        for _ in 0..1 + rng.below(3) {
            if rest.is_empty() {
                break;
            }
            let n = (1 + rng.below(CS / 3) as usize).min(rest.len());
            let piece: Vec<u8> = rest.drain(..n).collect();
            match w.write(&piece) {
                Ok(()) => {}
                Err(fetched::KeepError::Ended) => {
                    self.log.push("keep: its transfer ended".into());
                    rest.clear();
                }
                Err(e) => panic!("keeping failed: {e}"),
            }
        }
        if rest.is_empty() {
            self.log.push("keep: range done".into());
            self.intake = None;
        }
    }

    /// The transfer ends (superseded, failed or cancelled): its staging
    /// lock is released, while an intake range may still be writing.
    fn end(&mut self) {
        self.log.push("end".into());
        if let Some(a) = self.active.take() {
            a.t.release();
        }
    }

    fn commit(&mut self) {
        self.log.push("commit".into());
        self.active.as_ref().unwrap().t.commit().unwrap();
    }

    fn finish(&mut self) {
        let a = self.active.as_ref().unwrap();
        if !a.t.is_complete() || !a.t.is_sealed() {
            return;
        }
        self.log.push("finish".into());
        let root = a.t.finish().unwrap();
        let sent = a.content.manifest();
        // 3: the finish is what was sent, and the tree verifies.
        assert_eq!(root, sent.root(), "finish returned another root");
        let report = verify::verify(&self.store.model_dir(&self.name), &sent).unwrap();
        assert!(report.ok, "the finished tree does not verify: {report:?}");
        self.tampered.clear();
        a.t.release();
        self.active = None;
    }

    fn crash(&mut self) {
        self.log.push("crash".into());
        self.active = None;
        self.intake = None;
    }

    fn tamper(&mut self, rng: &mut Rng) {
        let Some(rec) = self.store.record_any(&self.name) else {
            return;
        };
        let files: Vec<&FileEntry> = rec.manifest.manifest.files().collect();
        let f = files[rng.below(files.len() as u64) as usize];
        let p = f.path.under(&self.store.model_dir(&self.name));
        let Ok(mut bytes) = fs::read(&p) else { return };
        if bytes.is_empty() {
            return;
        }
        let i = rng.below(bytes.len() as u64) as usize;
        bytes[i] ^= 0x01;
        fs::write(&p, &bytes).unwrap();
        // Written later than the store placed it: a later mtime.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(later)
            .unwrap();
        self.log.push(format!("tamper {}", f.path));
        self.tampered.insert(f.path.to_string());
    }

    fn remove(&mut self) {
        self.log.push("remove".into());
        self.store.remove(&self.name, true).unwrap();
        self.tampered.clear();
    }

    fn check(&self) {
        let dir = self.store.model_dir(&self.name);
        // 1: a complete record vouches only for matching bytes.
        if let Some(rec) = self.store.record(&self.name) {
            for f in rec.manifest.manifest.files() {
                let matches = fs::read(f.path.under(&dir))
                    .is_ok_and(|b| Hash::from(blake3::hash(&b)) == f.hash);
                let refused = rec.changed(&dir, &f.path).is_some();
                assert!(
                    matches || refused,
                    "the record vouches for {} but it holds other bytes",
                    f.path
                );
                assert!(
                    matches || self.tampered.contains(f.path.as_str()),
                    "{} holds bytes the record does not, and nobody changed it behind the store's back",
                    f.path
                );
            }
        }
        // 2: held means verified.
        if let Some(a) = &self.active {
            let t = &a.t;
            for num in t.held().iter() {
                let id = t.map().id(num);
                let expected = match &t.draft {
                    None => Some(t.map_file(id.file).chunks[id.index as usize]),
                    Some(d) => d.lock().unwrap().expected(num),
                };
                let Some(expected) = expected else { continue };
                let (f, _) = t.open_held(id).unwrap();
                let mut buf = vec![0u8; t.map().chunk_len(id) as usize];
                f.read_exact_at(&mut buf, t.map().offset(id)).unwrap();
                let count = t.map().file_range(id.file).count() as u64;
                assert_eq!(
                    hash::hash_chunk(&buf, id.index as u64, count, CS),
                    expected,
                    "chunk {id:?} is held but reads back other bytes"
                );
            }
        }
        // 4: nothing outside the root; only the model and .xfer inside.
        assert_eq!(fs::read(self.outside.join("canary")).unwrap(), b"untouched");
        assert_eq!(fs::read_dir(&self.outside).unwrap().count(), 1);
        for e in fs::read_dir(&self.root).unwrap() {
            let n = e.unwrap().file_name();
            assert!(n == "m" || n == ".xfer", "{n:?} appeared in the root");
        }
    }

    /// 5: an honest transfer of `v`, from whatever state, run to the end.
    fn complete(&mut self, v: usize) {
        self.active = None;
        self.intake = None;
        let m = self.versions[v].manifest();
        let t = self.store.begin(&self.name, m.clone()).unwrap();
        for num in 0..t.map().len() {
            if t.held().contains(num) {
                continue;
            }
            let id = t.map().id(num);
            let data = &self.versions[v].files[id.file as usize].1;
            let s = t.map().offset(id) as usize;
            t.write_chunk(id, &data[s..s + t.map().chunk_len(id) as usize])
                .unwrap();
        }
        assert_eq!(t.finish().unwrap(), m.root());
        drop(t);
        let rec = self.store.record(&self.name).expect("a complete record");
        assert_eq!(rec.manifest.root, m.root());
        let report = verify::verify(&self.store.model_dir(&self.name), &m).unwrap();
        assert!(report.ok, "{report:?}");
        for f in m.files() {
            assert!(rec
                .changed(&self.store.model_dir(&self.name), &f.path)
                .is_none());
        }
    }
}

fn run(seed: u64) {
    let mut rng = Rng(seed);
    let mut w = World::new();
    let steps = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..STEPS {
            w.step(&mut rng);
            w.check();
        }
        let v = rng.below(w.versions.len() as u64) as usize;
        w.log.push(format!("complete v{v}"));
        w.complete(v);
        w.check();
    }));
    if let Err(e) = steps {
        eprintln!("events of sequence {seed}:\n  {}", w.log.join("\n  "));
        std::panic::resume_unwind(e);
    }
}

#[test]
fn random_sequences_keep_the_store_invariants() {
    let seeds: Vec<u64> = match std::env::var("XFER_STORE_SEED") {
        Ok(s) => vec![s.parse().expect("XFER_STORE_SEED is a number")],
        Err(_) => (0..SEQUENCES).collect(),
    };
    for seed in seeds {
        if let Err(e) = std::panic::catch_unwind(|| run(seed)) {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("sequence {seed} broke an invariant: {why}\nreplay: XFER_STORE_SEED={seed} cargo test -p xfer --lib model_check");
        }
    }
}

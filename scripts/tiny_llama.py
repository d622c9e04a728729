"""Writes a tiny Llama that real vLLM can serve: random weights (seeded),
2 layers, hidden size 128, and a BPE tokenizer of 512 tokens trained here
on a few lines of text. About 1.7 MB, made in seconds with no download, so
the launcher's real-engine tests, benchmark and demo need no Hub.

usage: python tiny_llama.py DIR [--mib N [--shard-mib M]]   (the venv of scripts/engines.sh)

--mib N makes it at least N MiB instead (float32, hidden size 1024, as
many 45 MiB layers as it takes, same tokenizer), saved the way the Hub
keeps large checkpoints: shards of at most M MiB (default 64) named
model-0000i-of-0000n.safetensors with model.safetensors.index.json, so
that a download or a load can go shard by shard (scripts/bench-day.sh
uses --mib 272: 6 layers, 287 MB in 5 shards).
"""

import argparse
import json
import math
import os


# One layer of the --mib model (hidden 1024, intermediate 2816, 8 heads, 4
# KV heads): 11.8 M float32 parameters, 45 MiB; the embeddings and the
# head add 4 MiB.
BIG_LAYER_MIB = 45.0
BIG_EMBED_MIB = 4.0


def main(out: str, mib: int = 0, shard_mib: int = 64) -> None:
    os.makedirs(out, exist_ok=True)
    done = "model.safetensors.index.json" if mib else "model.safetensors"
    if os.path.exists(os.path.join(out, done)):
        return
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    words = (
        "the quick brown fox jumps over the lazy dog while models move across "
        "nodes in verified chunks and engines start only once weights agree "
    )
    corpus = [words * 4, " ".join(reversed(words.split())) * 4] * 16
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.model_max_length = 256
    fast.save_pretrained(out)

    if mib:
        layers = max(1, math.ceil((mib - BIG_EMBED_MIB) / BIG_LAYER_MIB))
        dims = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                    num_attention_heads=8, num_key_value_heads=4)
    else:
        dims = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    config = LlamaConfig(
        vocab_size=512,
        **dims,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    if mib:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=shard_mib << 20)
    else:
        model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="a random-weight Llama that vLLM can serve")
    ap.add_argument("dir")
    ap.add_argument("--mib", type=int, default=0, help="at least this many MiB, sharded (0: the 1.7 MB one)")
    ap.add_argument("--shard-mib", type=int, default=64, help="largest shard with --mib, MiB")
    a = ap.parse_args()
    main(a.dir, a.mib, a.shard_mib)

"""Writes a tiny Llama that real vLLM can serve: random weights (seeded),
2 layers, hidden size 128, and a BPE tokenizer of 512 tokens trained here
on a few lines of text. About 1.7 MB, made in seconds with no download, so
the launcher's real-engine tests, benchmark and demo need no Hub.

usage: python tiny_llama.py DIR   (the venv of scripts/engines.sh)
"""

import json
import os
import sys


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "model.safetensors")):
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

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_llama.py DIR")
    main(sys.argv[1])

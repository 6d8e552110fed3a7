"""Tiny Hugging Face model folders for tests, made here (nothing is downloaded): a
Llama-architecture model saved with ``save_pretrained`` and a byte-level BPE
``tokenizer.json`` trained with ``tokenizers`` on a small text."""

from __future__ import annotations

from pathlib import Path

TEXT = (
    "the cat sat on the mat. the dog sat on the log. a cat and a dog met on a mat. "
    "hello world, hello tokens, hello attention heads. "
) * 20


def train_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer trained on :data:`TEXT`, with a ``<s>`` BOS added to
    every encoding (as Llama's is), saved at ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.save(str(path))
    return path


def tiny_llama_config(vocab_size: int = 300):
    import transformers

    return transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
    )


def llama_folder(folder: Path, seed: int = 0) -> Path:
    """``folder`` with config.json, model.safetensors and tokenizer.json."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(tiny_llama_config()).eval()
    model.save_pretrained(folder)  # safetensors by default
    train_tokenizer(folder / "tokenizer.json")
    return folder


def sentencepiece_tokenizer(path: Path) -> Path:
    """A SentencePiece-style ``tokenizer.json`` as Llama 2 and Phi-3 ship theirs: BPE with
    ``▁`` for a space and ``<0xNN>`` byte-fallback tokens, whose decoder strips the space
    of the first token; a small hand-written vocabulary, saved at ``path``."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>", "<0x06>", "<0xE2>", "<0x80>", "<0x94>"]
    pieces += ["▁", "c", "n", "r", "e", "▁n", "re", "▁c"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    merges = [("▁", "n"), ("r", "e"), ("▁", "c")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(path))
    return path

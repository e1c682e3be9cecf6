"""A tiny, download-free Llama model folder for demos and tests on vLLM's CPU build.

``make_tiny_model`` writes ``config.json`` (LlamaForCausalLM: hidden 128, 2 heads of 64, 1 KV head,
2 layers, vocabulary 512), ``generation_config.json`` and a byte-level BPE tokenizer trained on a few
generated sentences.  There are no weights: serve it with ``vllm serve DIR --load-format dummy``.
transformers and tokenizers are imported only when a model is actually built.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, Llama-style: unk 0, bos 1, eos 2
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_WORDS = (
    "the a one every some model server token batch cache sweep point run node cluster request reply "
    "fast slow small large quick steady busy idle warm cold serves sends reads writes waits measures "
    "counts streams queues answers decodes fills drops keeps and or then while after before with "
    "from into over under on at by for of to in"
).split()


def _is_complete(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in REQUIRED_FILES)


def _config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "head_dim": 64,
        "num_attention_heads": 2, "num_key_value_heads": 1,  # head_dim 16 is refused by CPU attention
        "vocab_size": VOCAB_SIZE, "max_position_embeddings": 2048, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
    }


def _write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = _WORDS + ["".join(rng.choices("etaoinshrdlucmfwyp", k=rng.randint(2, 7))) for _ in range(400)]
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) + "." for _ in range(3000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:  # every id the model can emit must decode
        raise RuntimeError(f"tokenizer vocabulary {tok.get_vocab_size()} != {VOCAB_SIZE}")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def make_tiny_model(path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the tiny model folder at ``path`` (atomically) and return it.

    An existing complete folder is returned untouched unless ``overwrite`` is true.
    """
    target = Path(path).expanduser().resolve()
    if _is_complete(target) and not overwrite:
        log.debug("tiny model already present at %s", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(_config(), indent=2) + "\n")
        gen = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        _write_tokenizer(tmp)
        old = None
        if target.exists():  # os.replace cannot overwrite a non-empty directory: move it aside first
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "model")
        try:
            os.replace(tmp, target)
        except OSError:
            if _is_complete(target):  # a concurrent writer won the race; its folder is as good as ours
                log.debug("tiny model written concurrently at %s", target)
                return target
            raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("wrote tiny model to %s", target)
    return target

"""A zoo of tiny real models for tests: built from configs, no downloads, deterministic, a few ms each.

Every entry is a real class from transformers / diffusers / peft, shrunk to hidden 8-64, 1-2 layers and
vocab 128. ``build(name, dtype)`` gives a fresh object plus inputs that run its forward on CPU:

>>> import torch; from support import zoo
>>> b = zoo.build("llama", dtype=torch.bfloat16)
>>> b.kind, b.obj.model.embed_tokens.weight.dtype
('transformers', torch.bfloat16)
>>> with torch.no_grad():
...     tuple(b.run().logits.shape)
(1, 8, 128)

Low-precision builds are made the way users get them: built in fp32 from the config, then ``.to(dtype)``
(a config's ``dtype`` does not change constructor params), then the modules the class
declares fp32 are put back to fp32 as ``from_pretrained`` would (transformers: ``_keep_in_fp32_modules``
for fp16 only, ``_keep_in_fp32_modules_strict`` for fp16 and bf16; diffusers: ``_keep_in_fp32_modules``
for any dtype). ``t5`` (``wo``, fp16), ``dots1`` (``e_score_correction_bias``, bf16) and ``wan`` (norms,
``scale_shift_table``, time embedder, rope) carry such intentional fp32 tensors.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import torch
from torch import nn

__all__ = [
    "NAMES",
    "Built",
    "bnb_linear4bit",
    "bnb_linear8bit",
    "build",
    "lora_llama",
    "lora_unet",
    "tiny_clip_tokenizer",
    "tiny_flux",
    "tiny_llama",
    "tiny_sd_pipeline",
    "tiny_unet",
    "tiny_vae",
]

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

P = ParamSpec("P")
R = TypeVar("R")

VOCAB = 128
SEQ = 8
KINDS = ("transformers", "diffusers", "pipeline", "peft")


@dataclass(frozen=True)
class Built:
    """One zoo entry, freshly built: ``obj``, its ``inputs`` and ``call(obj, inputs=None)`` running the forward."""

    name: str
    obj: Any
    inputs: tuple[Any, ...] | dict[str, Any]
    call: Callable[..., Any]
    kind: str
    dtype: torch.dtype

    def run(self) -> Any:
        return self.call(self.obj)

    @property
    def args(self) -> tuple[Any, ...]:
        return self.inputs if isinstance(self.inputs, tuple) else ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.inputs) if isinstance(self.inputs, dict) else {}

    def target(self) -> Any:
        from torchdoctor._report.model import Target

        return Target(self.obj, self.args, self.kwargs)


def call_with(obj: Any, inputs: tuple[Any, ...] | dict[str, Any]) -> Any:
    """Run ``obj`` on ``inputs``: keyword arguments for a dict, positional for a tuple."""
    if isinstance(inputs, dict):
        return obj(**inputs)
    return obj(*inputs)


# --- quiet, seeded construction ----------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the libraries' harmless build-time chatter, then restore logging (tests read logs too).

    A process-wide ``logging.disable`` rather than per-library levels: transformers and diffusers reset their
    root logger's level when first imported, which may happen inside a build.
    """
    saved = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(saved)


def _quietly(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a public builder under ``_quiet`` so its lazy imports are quiet too."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with _quiet():
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    # fork_rng: seeding here must not disturb the caller's global RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with _quiet():
            yield


def _ids(n: int = SEQ, batch: int = 1, low: int = 3) -> torch.Tensor:
    # token ids stay clear of the special ids 0-2 so no model sees an accidental eos/pad mid-sequence
    return torch.randint(low, VOCAB, (batch, n))


def _floats(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def _match(pattern: str, name: str) -> bool:
    return f".{pattern}." in f".{name}."


def _keep_fp32_patterns(model: Any, dtype: torch.dtype) -> list[str]:
    """What ``from_pretrained(..., dtype)`` would keep in fp32 for this class (see the module docstring)."""
    if dtype == torch.float32:
        return []
    plan = getattr(model, "_get_dtype_plan", None)
    if plan is not None and hasattr(model, "_keep_in_fp32_modules_strict"):  # transformers
        return list(plan(dtype))
    return list(getattr(model, "_keep_in_fp32_modules", None) or [])  # diffusers: any requested dtype


def _finish(model: Any, dtype: torch.dtype) -> Any:
    model.eval()
    if dtype == torch.float32:
        return model
    patterns = _keep_fp32_patterns(model, dtype)
    # Keep the fp32 originals (not a bf16 round trip) of what loading would leave in fp32.
    kept = {name: t.data for name, t in _named_tensors(model)
            if t.is_floating_point() and any(_match(p, name) for p in patterns)}
    with _quiet():  # diffusers warns that .to() ignores _keep_in_fp32_modules: handled just below
        model.to(dtype)
    for name, t in _named_tensors(model):
        if name in kept:
            t.data = kept[name]  # keeps the Parameter object, as loading does
    return model


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]


# --- direct builders ------------------------------------------------------------------------------------------


@_quietly
def tiny_llama(dtype: torch.dtype = torch.float32, *, seed: int = 0, **config_overrides: Any) -> Any:
    """A 2-layer LlamaForCausalLM (hidden 64, 4 heads, 2 kv heads, vocab 128), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    cfg.update(config_overrides)
    with _seeded(seed):
        return _finish(LlamaForCausalLM(LlamaConfig(**cfg)), dtype)


@_quietly
def tiny_unet(dtype: torch.dtype = torch.float32, *, seed: int = 0) -> Any:
    """A UNet2DConditionModel with two blocks of 4/8 channels, cross-attention dim 8, sample 8x8."""
    from diffusers import UNet2DConditionModel

    with _seeded(seed):
        unet = UNet2DConditionModel(
            block_out_channels=(4, 8), layers_per_block=1, norm_num_groups=4, sample_size=8, in_channels=4,
            out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8, attention_head_dim=2,
        )
        return _finish(unet, dtype)


@_quietly
def tiny_flux(dtype: torch.dtype = torch.float32, *, seed: int = 0) -> Any:
    """A FluxTransformer2DModel with one double and one single block (2 heads of 16)."""
    from diffusers import FluxTransformer2DModel

    with _seeded(seed):
        flux = FluxTransformer2DModel(
            patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
        )
        return _finish(flux, dtype)


@_quietly
def tiny_vae(dtype: torch.dtype = torch.float32, *, seed: int = 0) -> Any:
    """An AutoencoderKL with channels 4/8 and 4 latent channels (scale factor 2)."""
    from diffusers import AutoencoderKL

    with _seeded(seed):
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, block_out_channels=(4, 8), latent_channels=4, norm_num_groups=4,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1, sample_size=16,
        )
        return _finish(vae, dtype)


def _clip_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    # A byte-level BPE small enough to write by hand: every lowercase letter alone and word-final, plus
    # merges that make "a", "cat" and "dog" single tokens. Unknown pieces map to <|endoftext|>.
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for piece in [*letters, *(c + "</w>" for c in letters), "ca", "cat</w>", "do", "dog</w>"]:
        vocab.setdefault(piece, len(vocab))
    merges = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>")]
    return vocab, merges


@_quietly
def tiny_clip_tokenizer(tmpdir: str | os.PathLike[str] | None = None) -> Any:
    """A CLIPTokenizer with a hand-written 58-token vocab and ``model_max_length=16``; nothing downloaded.

    With ``tmpdir`` the ``vocab.json`` / ``merges.txt`` files are written there and loaded from disk (the
    ``from_pretrained`` route); without it the tokenizer is built in memory.
    """
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab()
    with _quiet():
        if tmpdir is None:
            return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=16)  # type: ignore[arg-type]
        os.makedirs(tmpdir, exist_ok=True)
        with open(os.path.join(tmpdir, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f)
        with open(os.path.join(tmpdir, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
        with open(os.path.join(tmpdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizer_class": "CLIPTokenizer", "model_max_length": 16}, f)
        return CLIPTokenizer.from_pretrained(os.fspath(tmpdir))


def _clip_text_model(seed: int) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    with _seeded(seed):
        return CLIPTextModel(CLIPTextConfig(
            vocab_size=len(_clip_vocab()[0]), hidden_size=8, intermediate_size=16, num_attention_heads=2,
            num_hidden_layers=2, projection_dim=8, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
            pad_token_id=1,
        ))


@_quietly
def tiny_sd_pipeline(dtype: torch.dtype = torch.float32, *, seed: int = 0) -> Any:
    """A StableDiffusionPipeline of tiny parts (UNet, VAE, CLIP text encoder, hand-written tokenizer, DDIM)."""
    with _quiet():
        from diffusers import DDIMScheduler, StableDiffusionPipeline

        text_encoder = _finish(_clip_text_model(seed + 3), dtype)
        pipe: Any = StableDiffusionPipeline(
            unet=tiny_unet(dtype, seed=seed + 1), vae=tiny_vae(dtype, seed=seed + 2), text_encoder=text_encoder,
            tokenizer=tiny_clip_tokenizer(), scheduler=DDIMScheduler(num_train_timesteps=100),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False,
        )
        pipe.set_progress_bar_config(disable=True)
    return pipe


_LORA_LLAMA_TARGETS = ["q_proj", "v_proj"]
_LORA_UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _lora_config(targets: list[str]) -> Any:
    from peft import LoraConfig

    # init_lora_weights=False: lora_B is random, so an adapter that is skipped changes the output
    return LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False)


@_quietly
def lora_llama(dtype: torch.dtype = torch.bfloat16, autocast_adapter_dtype: bool = True, *, seed: int = 0) -> Any:
    """``peft.get_peft_model`` over ``tiny_llama(dtype)``, LoRA on q_proj/v_proj.

    With peft's default ``autocast_adapter_dtype=True`` the adapters are fp32 over a bf16/fp16 base.
    """
    from peft import get_peft_model

    base = tiny_llama(dtype, seed=seed)
    with _seeded(seed + 1):
        model = get_peft_model(base, _lora_config(_LORA_LLAMA_TARGETS), autocast_adapter_dtype=autocast_adapter_dtype)
    return model.eval()


@_quietly
def lora_unet(dtype: torch.dtype = torch.bfloat16, via: str = "diffusers", *, seed: int = 0) -> Any:
    """``tiny_unet(dtype)`` with LoRA on the attention projections.

    ``via="diffusers"``: ``unet.add_adapter`` (adapters in the base dtype), returns the UNet itself.
    ``via="peft"``: ``peft.get_peft_model`` (fp32 adapters over a low-precision base), returns the PeftModel.
    """
    unet = tiny_unet(dtype, seed=seed)
    with _seeded(seed + 1):
        if via == "diffusers":
            unet.add_adapter(_lora_config(_LORA_UNET_TARGETS))
            return unet.eval()
        if via == "peft":
            from peft import get_peft_model

            return get_peft_model(unet, _lora_config(_LORA_UNET_TARGETS)).eval()
    raise ValueError(f"via must be 'diffusers' or 'peft', not {via!r}")


# --- bitsandbytes (quantized on CPU, never run unless asked:) --------------------------------------


@_quietly
def bnb_linear4bit(
    in_features: int = 64,
    out_features: int = 128,
    compute_dtype: torch.dtype = torch.bfloat16,
    compress_statistics: bool = True,
    *,
    quant_type: str = "nf4",
    seed: int = 0,
) -> nn.Sequential:
    """``Sequential(proj=Linear4bit)``, quantized on CPU and never run, so ``weight.quant_state`` keeps its
    portable nested form (``absmax`` uint8, ``state2``): the first eval forward repacks it in place on this CPU."""
    import bitsandbytes as bnb

    with _seeded(seed):
        dense = nn.Linear(in_features, out_features)
        layer = bnb.nn.Linear4bit(
            in_features, out_features, compute_dtype=compute_dtype, compress_statistics=compress_statistics,
            quant_type=quant_type,
        )
        layer.load_state_dict(dense.state_dict())
        layer = layer.to("cpu")  # Params4bit.to(a real device) quantizes
    return nn.Sequential(OrderedDict(proj=layer)).eval()


@_quietly
def bnb_linear8bit(forward: bool = False, in_features: int = 64, out_features: int = 128, *, seed: int = 0) -> nn.Sequential:
    """``Sequential(proj=Linear8bitLt)``, quantized on CPU (``weight.CB/SCB``); with ``forward=True`` after one
    forward, which moves the statistics to ``layer.state.CB/SCB``."""
    import bitsandbytes as bnb

    with _seeded(seed):
        dense = nn.Linear(in_features, out_features)
        layer = bnb.nn.Linear8bitLt(in_features, out_features, has_fp16_weights=False)
        layer.load_state_dict(dense.state_dict())
        layer = layer.to("cpu")
        model = nn.Sequential(OrderedDict(proj=layer)).eval()
        if forward:
            with torch.no_grad():
                model(torch.randn(2, in_features))
    return model


# --- the registry -------------------------------------------------------------------------------------------------

Builder = Callable[[torch.dtype, int], tuple[Any, "tuple[Any, ...] | dict[str, Any]"]]


@dataclass(frozen=True)
class _Entry:
    builder: Builder
    kind: str


_ENTRIES: dict[str, _Entry] = {}


def _entry(name: str, kind: str) -> Callable[[Builder], Builder]:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")

    def register(fn: Builder) -> Builder:
        if name in _ENTRIES:
            raise ValueError(f"zoo entry {name!r} is registered twice")
        _ENTRIES[name] = _Entry(fn, kind)
        return fn

    return register


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Built:
    """A fresh, seeded instance of zoo entry ``name`` in ``dtype`` (eval mode), with inputs for its forward."""
    try:
        entry = _ENTRIES[name]
    except KeyError:
        raise KeyError(f"no zoo entry {name!r}; known: {', '.join(_ENTRIES)}") from None
    with _quiet():
        obj, inputs = entry.builder(dtype, seed)

    def call(target: Any, inputs_: tuple[Any, ...] | dict[str, Any] | None = None) -> Any:
        return call_with(target, inputs if inputs_ is None else inputs_)

    return Built(name, obj, inputs, call, entry.kind, dtype)


def _causal_lm(config_cls: str, model_cls: str, **cfg: Any) -> Builder:
    def builder(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
        import transformers

        with _seeded(seed):
            model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg))
            inputs = {"input_ids": _ids()}
        return _finish(model, dtype), inputs

    return builder


_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=64)
_LLAMA_LIKE = dict(_DECODER, num_key_value_heads=1, bos_token_id=1, eos_token_id=2, pad_token_id=0)

_entry("llama", "transformers")(lambda dtype, seed: (tiny_llama(dtype, seed=seed), {"input_ids": _seeded_ids(seed)}))
_entry("mistral", "transformers")(_causal_lm("MistralConfig", "MistralForCausalLM", **_LLAMA_LIKE, sliding_window=4))
_entry("qwen2", "transformers")(_causal_lm("Qwen2Config", "Qwen2ForCausalLM", **_LLAMA_LIKE))
_entry("gemma", "transformers")(_causal_lm("GemmaConfig", "GemmaForCausalLM", **_LLAMA_LIKE, head_dim=16))
_entry("phi", "transformers")(_causal_lm("PhiConfig", "PhiForCausalLM", **_DECODER, bos_token_id=1, eos_token_id=2))
_entry("gpt_neox", "transformers")(_causal_lm("GPTNeoXConfig", "GPTNeoXForCausalLM", **_DECODER, bos_token_id=1,
                                              eos_token_id=2))
_entry("opt", "transformers")(_causal_lm(
    "OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=0,
    eos_token_id=2,
))
_entry("falcon", "transformers")(_causal_lm(
    "FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=2, bos_token_id=1, eos_token_id=2,
))
_entry("mixtral", "transformers")(_causal_lm("MixtralConfig", "MixtralForCausalLM", **_LLAMA_LIKE,
                                             num_local_experts=4, num_experts_per_tok=2))
_entry("dots1", "transformers")(_causal_lm(
    "Dots1Config", "Dots1ForCausalLM", **_LLAMA_LIKE, moe_intermediate_size=16, n_routed_experts=4,
    n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, sliding_window=None,
))
_entry("gpt2", "transformers")(_causal_lm(
    "GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
    bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
))


def _seeded_ids(seed: int) -> torch.Tensor:
    with _seeded(seed):
        return _ids()


@_entry("llama_pretrained", "transformers")
def _llama_pretrained(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    # The state users really get from the hub: in bf16/fp16 from_pretrained keeps the rotary inv_freq buffers
    # fp32 (they are not in the checkpoint), where .to(dtype) casts them.
    return _round_trip(tiny_llama(seed=seed), dtype), {"input_ids": _seeded_ids(seed)}


def _round_trip(model: Any, dtype: torch.dtype) -> Any:
    """``save_pretrained`` into a temporary directory, then ``from_pretrained(dir, dtype=dtype)``."""
    import tempfile

    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
            model.save_pretrained(tmp)
            key = "torch_dtype" if type(model).__module__.startswith("diffusers") else "dtype"
            return type(model).from_pretrained(tmp, **{key: dtype}).eval()
    finally:
        if bars:
            hf_logging.enable_progress_bar()


@_entry("t5", "transformers")
def _t5(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    from transformers import T5Config, T5ForConditionalGeneration

    with _seeded(seed):
        model = T5ForConditionalGeneration(T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2,
            relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        ))  # type: ignore[call-arg]
        inputs = {"input_ids": _ids(), "decoder_input_ids": _ids(4)}
    return _finish(model, dtype), inputs


@_entry("bart", "transformers")
def _bart(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    from transformers import BartConfig, BartForConditionalGeneration

    with _seeded(seed):
        model = BartForConditionalGeneration(BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
        ))
        inputs = {"input_ids": _ids(), "decoder_input_ids": _ids(4)}
    return _finish(model, dtype), inputs


@_entry("whisper", "transformers")
def _whisper(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    with _seeded(seed):
        model = WhisperForConditionalGeneration(WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None,
        ))
        # the encoder's two convolutions (stride 1, then 2) turn 2 * max_source_positions frames into 16
        inputs = {"input_features": _floats(1, 8, 32, dtype=dtype), "decoder_input_ids": _ids(4)}
    return _finish(model, dtype), inputs


@_entry("clip_text", "transformers")
def _clip_text(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    model = _clip_text_model(seed)
    with _seeded(seed):
        ids = torch.randint(2, len(_clip_vocab()[0]), (1, SEQ))
        ids[:, 0], ids[:, -1] = 0, 1
    return _finish(model, dtype), {"input_ids": ids}


@_entry("vit", "transformers")
def _vit(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    from transformers import ViTConfig, ViTForImageClassification

    with _seeded(seed):
        model = ViTForImageClassification(ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=64, num_labels=3,
        ))  # type: ignore[call-arg]
        inputs = {"pixel_values": _floats(1, 3, 16, 16, dtype=dtype)}
    return _finish(model, dtype), inputs


@_entry("bert", "transformers")
def _bert(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    from transformers import BertConfig, BertModel

    with _seeded(seed):
        model = BertModel(BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, pad_token_id=0,
        ))
        inputs = {"input_ids": _ids(), "attention_mask": torch.ones(1, SEQ, dtype=torch.long)}
    return _finish(model, dtype), inputs


@_entry("unet", "diffusers")
def _unet(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    return tiny_unet(dtype, seed=seed), _unet_inputs(dtype, seed)


def _unet_inputs(dtype: torch.dtype, seed: int) -> dict[str, Any]:
    with _seeded(seed + 100):
        return {
            "sample": _floats(1, 4, 8, 8, dtype=dtype),
            "timestep": torch.tensor([10]),
            "encoder_hidden_states": _floats(1, 4, 8, dtype=dtype),
        }


@_entry("flux", "diffusers")
def _flux(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    model = tiny_flux(dtype, seed=seed)
    with _seeded(seed + 100):
        inputs = {
            "hidden_states": _floats(1, 16, 4, dtype=dtype),
            "encoder_hidden_states": _floats(1, 6, 32, dtype=dtype),
            "pooled_projections": _floats(1, 32, dtype=dtype),
            "timestep": torch.tensor([0.5]).to(dtype),
            "img_ids": torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0),
                                                  indexing="ij"), -1).reshape(16, 3).to(dtype),
            "txt_ids": torch.zeros(6, 3, dtype=dtype),
        }
    return model, inputs


@_entry("vae", "diffusers")
def _vae(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    model = tiny_vae(dtype, seed=seed)
    with _seeded(seed + 100):
        return model, {"sample": _floats(1, 3, 16, 16, dtype=dtype)}


@_entry("wan", "diffusers")
def _wan(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    from diffusers import WanTransformer3DModel

    with _seeded(seed):
        model = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
        )
        inputs = {
            "hidden_states": _floats(1, 4, 2, 4, 4, dtype=dtype),
            "timestep": torch.tensor([10]),
            "encoder_hidden_states": _floats(1, 6, 16, dtype=dtype),
        }
    return _finish(model, dtype), inputs


@_entry("sd_pipeline", "pipeline")
def _sd_pipeline(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    pipe = tiny_sd_pipeline(dtype, seed=seed)
    with _seeded(seed + 100):
        latents = _floats(1, 4, 8, 8, dtype=dtype)  # given, so no generator state is involved
    # output_type="pt" runs the VAE decode too, and avoids .numpy() (which fake tensors cannot do)
    return pipe, {"prompt": "a cat", "num_inference_steps": 2, "height": 16, "width": 16, "latents": latents,
                  "output_type": "pt"}


@_entry("llama_lora", "peft")
def _llama_lora(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    return lora_llama(dtype, seed=seed), {"input_ids": _seeded_ids(seed)}


@_entry("unet_lora", "peft")
def _unet_lora(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    return lora_unet(dtype, via="diffusers", seed=seed), _unet_inputs(dtype, seed)


@_entry("unet_lora_peft", "peft")
def _unet_lora_peft(dtype: torch.dtype, seed: int) -> tuple[Any, dict[str, Any]]:
    return lora_unet(dtype, via="peft", seed=seed), _unet_inputs(dtype, seed)


NAMES: tuple[str, ...] = tuple(_ENTRIES)

"""Context for ``explain``: facts derived from an error's fields and the text around it, and the ranking of
categories and causes by the context rules (``rules``).

Fields are only what the text says: devices and dtypes come from the message (through ``tokens``), never from a
default; a template that needs a field the text does not give is left out by the renderer.
"""

from __future__ import annotations

import re
from typing import Any

from torchdoctor._explain.backends import backends
from torchdoctor._explain.causes import ContextRule
from torchdoctor._explain.direction import MATMUL_INPUT, sides
from torchdoctor._explain.present import Present, plans
from torchdoctor._explain.prose import LINES, prose_only
from torchdoctor._explain.prose import said as said_of
from torchdoctor._explain.tokens import (ACCELERATORS, device_name, dtype_name, find_word, names_in,
                                        transformers_version, type_name)

__all__ = ["MAC", "derive", "find_word", "lookup", "rank", "transformers_version"]

_LOW = ("float16", "bfloat16")
_METHOD = {"float32": ".float()", "float16": ".half()", "bfloat16": ".bfloat16()", "float64": ".double()",
           "int64": ".long()", "int32": ".int()", "bool": ".bool()"}


def _windows(context: str) -> bool:
    """A Windows path (``c:/users/...``; the context is lower-cased with ``\\`` read as ``/``) in the context."""
    p = context.find(":/")
    for _ in range(1000):
        if p == -1:
            return False
        if p >= 1 and "a" <= context[p - 1] <= "z" and (p < 2 or not context[p - 2].isalnum()):
            return True
        p = context.find(":/", p + 2)
    return False


# Words of a Mac (lower-cased context): its home folders, the ComfyUI desktop app's bundle
# (/Applications/ComfyUI.app/Contents), Homebrew; "c:/users/" is a Windows path (the ``windows`` flag rules it out)
MAC = ("/users/", "/applications/", ".app/contents/", "/opt/homebrew/", "macos", "darwin", "macbook", "apple",
       r"\bmps\b", "arm64")


# kernels that take only integer or bool tensors on every device (bitwise logic and shifts, gcd, counting, a loss's
# class targets), and kernels that have no integer version on any device (lerp, softmax, norms, convolutions,
# activations, random fills): a kernel that lacks an integer version on one device only (abs on mps) is neither
_INTEGER_OP = re.compile(r"(?:^|_)(?:bitwise|lshift|rshift|gcd|lcm|bincount|nll)(?:_|$)")
_FLOAT_OP = re.compile(r"(?:^|_)(?:lerp|\w*softmax|\w*norm\w*|\w*conv\w*|gelu|silu|sigmoid|tanh|erf|erfinv|"
                       r"uniform|bernoulli|dropout|mse)(?:_|$)")
_MPS_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i64": "int64", "i32": "int32"}
_WIDE = ("float32", "float64")
_REDUCED = ("float16", "bfloat16")


def _gpu_word(value: str, context: str) -> str:
    """Older messages say "GPU" for any accelerator (on a Mac too): mps where the text shows a Mac and no CUDA."""
    mac = value.strip().lower() == "gpu" and not _windows(context) and "cuda:" not in context
    return "mps" if mac and "nvidia" not in context and any(find_word(context, w) != -1 for w in MAC) else value


def derive(sig_name: str, fields: dict[str, str], message: str,
           context: str = "") -> tuple[dict[str, str], frozenset[str]]:
    """Normalise the extracted fields, add derived ones (``target``, ``low``, ``devices``, ``dtype_kw`` ...) and flags.

    ``message`` is the error's own lines; ``context`` the lower-cased text around it (frames, versions).
    """
    f = {k: v.strip() for k, v in fields.items()}
    flags: set[str] = set()
    devices: list[str] = []
    dtypes: list[str] = []

    def add(seq: list[str], item: str | None) -> None:
        if item and item not in seq:
            seq.append(item)

    dtype_sig = sig_name.startswith(("dtype", "unsupported"))
    for key in ("a", "b"):
        if key in f:
            d = None if dtype_sig else device_name(_gpu_word(f[key], context))
            if d:
                f[key] = d
                add(devices, d)
            elif t := dtype_name(f[key]) or type_name(f[key])[1]:  # (read only where no device is)
                f[key] = t
                add(dtypes, t)
    if "input" in f and "weight" in f:  # conv/linear "Input type (X) and weight type (Y)"
        (di, ti), (dw, tw) = type_name(f["input"]), type_name(f["weight"])
        if di and dw and di != dw:
            flags.add("iw_device")
            f["input_device"], f["weight_device"] = di.split(":")[0], dw.split(":")[0]
            f["diff"] = f"the input is on {f['input_device']}, the {f.get('param', 'weight')} on {f['weight_device']}"
            add(devices, di)
            add(devices, dw)
        if ti and tw and ti != tw:
            flags.add("iw_dtype")
            f["a"], f["b"] = ti, tw
            add(dtypes, ti)
            add(dtypes, tw)
            f.setdefault("diff", f"the input is {ti}, the {f.get('param', 'weight')} is {tw}")
            # the direction decides: a full-precision (or integer) input meeting reduced-precision weights is the
            # operand not cast; a reduced input meeting float32 weights is a layer the cast left behind
            if not (di and dw and di != dw) and (ti in _WIDE or not ti.startswith(("float", "bfloat"))) \
                    and (tw in _REDUCED or tw.startswith("float8") or not ti.startswith(("float", "bfloat"))
                         or (ti == "float64" and tw == "float32")):
                flags.add("iw_operand")
            if not (di and dw and di != dw):
                flags.update(sides(ti, tw))
    elif sig_name == "dtype.same_dtype" and f.get("lhs", "").lower() in MATMUL_INPUT and "a" in f and "b" in f:
        flags.update(sides(f["a"], f["b"]))  # mat1 is F.linear's input, mat2 its weight
        f.setdefault("param", "weight")
    if sig_name.startswith("deserialize"):
        backend = f.get("backend", "cuda").lower()
        f.setdefault("saved", f"{backend}:{f['index']}" if "index" in f else backend)
        add(devices, device_name(f["saved"].split(",")[0]))
    if sig_name == "device.first_device" and "index" in f and "b" not in f:
        f["b"] = f"cuda:{f['index']}"
        add(devices, f["b"])
    if "b" in f and sig_name.startswith("mixed.meta") and f["b"].isdigit():
        f["b"] = f"cuda:{f['b']}"
    named_devices, named_dtypes = names_in(message[:4000])
    # "GPU" read as cuda:0 there (asked only where the message names cuda:0)
    mac_gpu = "cuda:0" in named_devices and "cuda" not in message.lower() and _gpu_word("GPU", context) == "mps"
    for d in named_devices:
        add(devices, "mps:0" if mac_gpu and d == "cuda:0" else d)
    for t in named_dtypes if not dtypes or not dtype_sig else ():
        add(dtypes, t)
    if "dtype" in f:
        f["dtype"] = dtype_name(f["dtype"]) or f["dtype"]
        add(dtypes, f["dtype"])

    if "method" in f:
        op = re.sub(r"^wrapper_+(?:CUDA_+|XPU_+|MPS_+|CPU_+)?", "", f["method"])
        f.setdefault("op", op.strip("_") or f["method"])
    kernel = f.get("kernel", "").lower()
    if kernel:
        kdev = next((d for d in ("cpu", "mps", "cuda", "xpu") if d in kernel.split("_")), None)
        f["device"] = kdev or "cpu"
        flags.add(f"kernel_{kdev or 'cpu'}")
        add(devices, device_name(kdev or "cpu"))
        kind = f.get("dtype", "")  # a dtype the op never takes, whatever the device: not a precision question
        if (kind == "bool" or kind.startswith(("int", "uint"))) and _FLOAT_OP.search(kernel):
            flags.add("kernel_integer_dtype")  # an integer / bool tensor reached floating-point math (lerp, conv)
            flags.update(("kernel_lerp",) if "lerp" in kernel.split("_") else ())
        elif kind.startswith(("float", "bfloat")) and _INTEGER_OP.search(kernel):
            flags.add("kernel_integer_op")  # a floating tensor reached an op for integers / bools (bitwise_and)
            flags.update(("kernel_targets",) if "nll" in kernel.split("_") else ())
    op = f.get("op", "")
    backend = f.get("backend", "").lower()
    if backend and device_name(backend):
        add(devices, device_name(backend))
    if backend:
        f["backend_name"] = {"cuda": "CUDA", "xpu": "XPU", "mps": "MPS"}.get(backend, f["backend"])
        if device_name(backend):  # the device a file's tensors name, when torch.load is what ran into it
            f.setdefault("saved", backend)
    if backend.startswith("quantized") or op.startswith("quantized::"):
        flags.add("quantized_backend")  # a quantized tensor at a float op, or a float one at a quantized op
    elif backend == "meta" and op.startswith("aten::"):
        flags.add("meta_op")  # a core op run on meta placeholders: a model never materialised
    if op.startswith("torch_ipex::"):
        flags.add("op_ipex")
    if "intel-ext-pt" in f.get("lib", ""):
        flags.add("ipex_lib")  # IPEX's library does not load: built for another torch
    if op.startswith(("torchvision::", "torchaudio::")):
        flags.add("op_torchvision")
    if "_scaled_mm" in op:
        flags.add("op_scaled_mm")
    short, accel, named = backends(f.get("available", ""))
    if short:
        f["available_short"] = short
        if accel:
            f["available_device"] = accel
        if (op.startswith("aten::") and backend.split("_")[0] in ACCELERATORS + ("hip",)
                and backend.upper() not in named):
            flags.add("backend_absent")
    if (sig_name == "backend.could_not_run" and op.startswith("aten::empty")
            and (not backend or backend.split("_")[0] in ACCELERATORS + ("hip",))):
        flags.add("backend_absent")  # not even an empty tensor of the device: the build has no such backend at all
    if f.get("have", "").endswith("+cpu"):
        flags.add("have_cpu")
    if sig_name in ("dtype.out_cast", "unsupported.numpy_dtype", "unsupported.xpu_fp64"):  # the last two: a dtype
        flags.add("out_cast" if sig_name == "dtype.out_cast" else "code_dtype")  # code chose, no app flag reaches
    if sig_name == "device.conv_input" and "a" in f:  # which side of the layer stayed behind
        flags.add("input_behind" if f["a"] == "cpu" else "weights_behind")
    if sig_name.startswith(("frames.", "partial.")):
        flags.add("frames_only")
    if sig_name == "device.numpy":  # the code converts a GPU tensor itself: no placement or app flag is the cause
        flags.add("to_numpy")
    if sig_name == "dtype.mps_broadcast":  # MPSGraph spells dtypes f32 / f16 / i64
        for key in ("a", "b"):
            if key in f:
                f[key] = _MPS_DT.get(f[key], f[key])
                add(dtypes, f[key])

    accels = [d for d in devices if d.split(":")[0] in ACCELERATORS]
    if "meta" in devices:
        flags.add("meta")
    if len(set(accels)) >= 2:
        flags.add("two_accels")
    if accels and "cpu" in devices:
        flags.add("cpu_and_accel")
    for d in devices:
        flags.add(d.split(":")[0])
    for t in dtypes:
        flags.add({"float16": "half", "bfloat16": "bf16", "float64": "fp64"}.get(t, t))
        if t.startswith("float8"):
            flags.add("fp8")
    if dtype_sig and f.get("a") in dtypes and f.get("b") in dtypes:
        flags.add("ab_dtypes")
    if accels:
        f["target"] = accels[0]
    elif "op_ipex" in flags:
        f["target"] = "xpu:0"
    elif sig_name.startswith("quant.bnb") and "gpu" in message.lower():  # bitsandbytes says GPU for CUDA
        f["target"] = "cuda:0"
    f["tq"] = f'"{f["target"]}"' if "target" in f else "device"
    if "b" in f and device_name(f["b"]):
        f["bq"] = f'"{f["b"]}"'
    if devices:
        f["devices"] = ", ".join(devices)
    low = next((t for t in dtypes if t in _LOW), None)
    fp8 = next((t for t in dtypes if t.startswith("float8")), None)
    if low:
        f["low"] = low
        high = next((t for t in dtypes if t != low and not t.startswith("float8")), None)
        if high:
            f["high"] = high
    if low:
        f["low_t"] = f"torch.{low}"
    other = next((t for t in dtypes if not t.startswith("float8")), None)
    if other:
        f["other_dtype"] = other
    if fp8:  # the dtype an fp8 model is loaded in instead: its input's (bf16 when the text names none)
        f["fp_eight"] = fp8
        f["fp_eight_into"] = other if other in ("float16", "bfloat16", "float32") else "bfloat16"
    for key in ("a", "b"):
        t = f.get(key, "")
        if t in _METHOD:
            f[f"{key}_method"] = _METHOD[t]
        if dtype_name(t) or t.startswith("float8"):
            f[f"{key}_t"] = f"torch.{t}"

    if context and _windows(context):
        flags.add("windows")
    version = transformers_version(context) if context else None
    f["dtype_kw"] = "torch_dtype" if version and version < (4, 56) else "dtype"
    f["dtype_note"] = "" if version else "  # transformers < 4.56: torch_dtype="
    return f, frozenset(flags)



_PROSE_SCALE = 0.5  # a word only in prose weighs half, and never re-files the error


def rank(category: str, base: tuple[tuple[str, float], ...], alternatives: tuple[tuple[str, float, str], ...],
         context: str, flags: frozenset[str], rules: tuple[ContextRule, ...], message: str = "",
         look: Present | None = None
         ) -> tuple[list[tuple[str, float, str]], list[tuple[str, float]], list[tuple[ContextRule, str]]]:
    r"""Apply the rules. Returns the categories best first as ``(category, score, why)`` (the signature's own
    category scores 1.0), the causes best first, and the rules that fired with the word that fired them.

    A word found only in prose typed around the paste (``message``, the error's own lines lower-cased, never
    counts as prose) weighs half and cannot re-file the error: the message and the frames outrank what the user
    wrote about them.

    >>> from torchdoctor._explain.catalog import context_rules
    >>> text = "i fine-tune llama with qlora and get this\nexpected all tensors to be on the same device"
    >>> rank("device_mismatch", (), (), text, frozenset({"cpu_and_accel"}), context_rules())[0][0][0]
    'device_mismatch'
    """
    # a word is looked up only for a rule that could fire, once (``present``: by its shape, behind shorter words);
    # ``look``: the diagnosis's own, for ``context`` (its answers serve the app's words after it)
    if look is None:
        look = lookup(context, rules)
    by_words: dict[int, Any] = {}
    prose: dict[str, bool] = {}
    said: list[str] = []  # the message without typed prose, and what each line read was, once per diagnosis
    lines = LINES if len(LINES) < 8192 else {}  # what each line is: pure in the line, kept for the text (``prose``)

    def scale(word: str) -> float:
        got = prose.get(word)
        if got is None:
            if not said:
                said.append(said_of(message))
            got = prose[word] = prose_only(context, word, said[0], lines)
        return _PROSE_SCALE if got else 1.0

    # a rule's words are read once per word list (rules that share one, BNB, PEFT ...: once), and only for a rule
    # whose flags hold (``_passing``: those rules per category and flags, once per process)
    first = look.first

    score: dict[str, float] = {category: 1.0}
    from_prose: dict[str, float] = {}
    why: dict[str, str] = {category: ""}
    for cat, weight, reason in alternatives:
        score[cat] = score.get(cat, 0.0) + weight
        why.setdefault(cat, reason)
    for rule in _passing(rules, (category,), True, flags):
        word = _word(rule, by_words, first)
        if word is None:
            continue
        cat = rule.category or ""  # never None here (``scoring``)
        if scale(word) < 1.0:  # prose alone offers a category as an alternative, never as the diagnosis
            from_prose[cat] = from_prose.get(cat, 0.0) + rule.weight * _PROSE_SCALE
            why.setdefault(cat, rule.why or f"the text mentions '{word}'")
            continue
        score[cat] = score.get(cat, 0.0) + rule.weight
        reason = rule.why or f"the text mentions '{word}'"
        why[cat] = reason + (f" ('{word}')" if word and rule.why else "")
    own = score[category]
    for cat, extra in from_prose.items():  # all prose together stays below the message's own category
        base_score = score.get(cat, 0.0)
        score[cat] = max(base_score, min(base_score + extra, own - 0.05)) if cat != category else base_score + extra
    ordered = sorted(((c, s, why.get(c, "")) for c, s in score.items()), key=lambda x: (-x[1], x[0] != category))
    top = ordered[0][0]

    scores: dict[str, float] = {}
    for cid, w in base:
        scores[cid] = scores.get(cid, 0.0) + w
    fired: list[tuple[ContextRule, str]] = []
    for rule in _passing(rules, (category, top) if top != category else (category,), False, flags):
        if rule.category and rule.category != top:
            continue  # its causes belong to a category that did not win
        word = _word(rule, by_words, first)
        if word is None:
            continue
        for cid, w in rule.boosts:
            scores[cid] = scores.get(cid, 0.0) + w * (scale(word) if w > 0 else 1.0)
        fired.append((rule, word))
    families = _FAMILIES.get(top, ())
    ranked = sorted(((c, s) for c, s in scores.items() if s > 0 and c.startswith(families)), key=lambda cs: -cs[1])
    return ordered, ranked, fired


def lookup(context: str, rules: tuple[ContextRule, ...]) -> Present:
    """Whether words occur in ``context``, each answered once, as ``rank`` reads the rules' words."""
    return Present(context, plans(rules, (w for r in rules for w in r.words)))


_UNSEEN: Any = object()


def _word(rule: ContextRule, by_words: dict[int, Any], first: Any) -> str | None:
    """The word of ``rule`` the context holds ("" for a rule of no words), None when it holds none; each word list
    looked up once per context (``by_words``, by the list's identity)."""
    words = rule.words
    if not words:
        return ""
    word = by_words.get(id(words), _UNSEEN)
    if word is _UNSEEN:
        word = by_words[id(words)] = first(words)
    return word  # type: ignore[no-any-return]
_APPLYING: dict[tuple[int, tuple[str, ...], bool], tuple[tuple[ContextRule, ...], tuple[ContextRule, ...]]] = {}


def _applying(rules: tuple[ContextRule, ...], cats: tuple[str, ...], scoring: bool = False) -> tuple[ContextRule, ...]:
    """The rules that apply to any of ``cats`` (``applies_to`` empty or naming one), in their order (``scoring``:
    only those that score a category); per rule table and categories once per process (most rules apply to one
    family: a diagnosis looked at all of them twice)."""
    got = _APPLYING.get((id(rules), cats, scoring))
    if got is None or got[0] is not rules:  # the table itself is kept with its answer: an id is never reused stale
        if len(_APPLYING) > 512:
            _APPLYING.clear()
        got = _APPLYING[(id(rules), cats, scoring)] = (rules, tuple(
            r for r in rules if (not r.applies_to or any(c in r.applies_to for c in cats))
            and (not scoring or r.category is not None)))
    return got[1]
_PASSING: dict[tuple[int, tuple[str, ...], bool, frozenset[str]], tuple[object, tuple[ContextRule, ...]]] = {}


def _passing(rules: tuple[ContextRule, ...], cats: tuple[str, ...], scoring: bool,
             flags: frozenset[str]) -> tuple[ContextRule, ...]:
    """``_applying``'s rules whose ``flags`` all hold and none of whose ``unless`` does, in their order; per rule
    table, categories and flags once per process (a log of errors has a hundred distinct sets of flags at most)."""
    got = _PASSING.get((id(rules), cats, scoring, flags))
    if got is None or got[0] is not rules:
        if len(_PASSING) > 2048:
            _PASSING.clear()
        got = _PASSING[(id(rules), cats, scoring, flags)] = (rules, tuple(
            r for r in _applying(rules, cats, scoring)
            if all(fl in flags for fl in r.flags) and not any(fl in flags for fl in r.unless)))
    return got[1]


# Which causes make sense under each category (a rule may fire for several categories).
_FAMILIES = {"device_mismatch": ("dev.",), "quantization_device": ("q.", "dev."),
             "mixed_device_model": ("md.", "dev."), "input_weight_type_mismatch": ("iw.", "dt."),
             "dtype_mismatch": ("dt.",), "unsupported_dtype_on_device": ("ud.", "dt."),
             "backend_op_missing": ("bo.", "na."), "deserialize_device": ("ds.",), "no_accelerator": ("na.", "bo."),
             "cpu_gpu_indexing": ("ix.", "dev.")}

"""Device and dtype tokens in error text: the one parser for how PyTorch messages (of every version) name them.

Torch-free: ``explain`` reads logs on machines without torch, and ``guard`` reuses these two functions. Their
names and signatures are stable:

>>> devices_in("Expected all tensors to be on the same device, but found at least two devices, CPU and CUDA:0!")
['cpu', 'cuda:0']
>>> devices_in("Input type (CUDABFloat16Type) and weight type (torch.FloatTensor) should be the same")
['cuda:0', 'cpu']
>>> dtypes_in("Input type (CUDABFloat16Type) and weight type (torch.FloatTensor) should be the same")
['bfloat16', 'float32']
>>> dtypes_in("expected m1 and m2 to have the same dtype, but got: struct c10::Half != float")
['float16', 'float32']
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["ACCELERATORS", "devices_in", "dtype_name", "device_name", "dtypes_in", "find_word", "names_in",
           "transformers_version", "type_name"]

ACCELERATORS = ("cuda", "xpu", "mps", "hpu", "npu", "xla", "mtia", "privateuseone")
_LIMIT = 20_000  # characters of one message looked at; a token list is about one error, not a whole log

# dtype spellings in messages -> torch names (keys lower-case, without "torch." / "c10::" / "struct ")
DTYPES = {
    "float": "float32", "float32": "float32", "single": "float32", "half": "float16", "float16": "float16",
    "bfloat16": "bfloat16", "double": "float64", "float64": "float64", "long": "int64", "int64": "int64",
    "long int": "int64", "int": "int32", "int32": "int32", "bool": "bool", "byte": "uint8", "uint8": "uint8",
    "char": "int8", "int8": "int8", "short": "int16", "int16": "int16", "complexfloat": "complex64",
    "complexdouble": "complex128", "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz", "complexhalf": "complex32", "fp16": "float16", "bf16": "bfloat16",
    "fp32": "float32", "unsigned char": "uint8", "signed char": "int8",
}
_LEGACY = r"BFloat16|Float8_?\w{0,12}|Float|Half|Double|Long|Int|Short|Char|Byte|Bool|ComplexFloat|ComplexDouble"
# One pass finds both kinds, so the order of appearance is kept across spellings.
_TOKEN = re.compile(
    # legacy tensor type names: torch.cuda.HalfTensor, torch.FloatTensor (cpu), CUDABFloat16Type, CPUFloatType
    rf"\btorch\.(?:(?P<ldev>cuda|xpu|mps)\.)?(?P<ldt>{_LEGACY})Tensor\b"
    rf"|\b(?P<pdev>CUDA|CPU|XPU|MPS)(?P<pdt>{_LEGACY})Type\b"
    # device(type='cuda', index=1)
    r"|device\(type=['\"](?P<rdev>\w{1,12})['\"](?:, ?index=(?P<ridx>\d{1,3}))?\)"
    # "is on CPU, but expected it to be on GPU" (older messages)
    r"|\b(?:on|to be on) (?P<word>CPU|GPU)\b"
    # cuda, cuda:1, CUDA:0, cpu, mps, meta (torch prints the device lower-case; "Meta" is a backend name)
    r"|(?<![\w.])(?P<dev>cuda|CUDA|Cuda|cpu|CPU|xpu|XPU|mps|MPS|meta|hpu|HPU|npu|NPU|xla|XLA)"
    r"(?::(?P<idx>\d{1,3}))?(?![\w.]|:\w)"
    # torch.float16, c10::BFloat16, struct c10::Half, long int, Half, float
    r"|(?:\btorch\.|\bc10::|\b)(?P<dt>bfloat16|BFloat16|float8_e4m3fnuz|float8_e5m2fnuz|float8_e4m3fn|"
    r"float8_e5m2|Float8_e4m3fnuz|Float8_e5m2fnuz|Float8_e4m3fn|Float8_e5m2|float16|float32|float64|"
    r"complex64|complex128|ComplexFloat|ComplexDouble|ComplexHalf|int64|int32|int16|int8|uint8|long int|"
    r"Half|half|Float|float|Double|double|Long|Int|Short|Char|Byte|Bool|fp16|bf16|fp32)\b(?![.(])")
# ``_scan`` reads a match's groups in this order
assert tuple(_TOKEN.groupindex) == ("ldev", "ldt", "pdev", "pdt", "rdev", "ridx", "word", "dev", "idx", "dt")
_DEVICE_WORD = {"gpu": "cuda"}
# Where a token can start: every alternative of ``_TOKEN`` begins with one of these words (its look-behinds and
# ``\b`` only narrow that). ``_TOKEN`` itself starts with look-arounds, so ``re`` tries it at every character (~120
# ns each); this pattern starts with a literal character at each branch, so ``re`` skips to the next one of them,
# and ``_TOKEN`` is tried only where one of these words starts: the same matches, about a third of the time.
_STARTS = ("B(?:Float16|ool|yte)|C(?:PU|UDA|har|omplex(?:Double|Float|Half)|uda)|Double|Float|H(?:PU|alf)|Int|Long|"
           "MPS|NPU|Short|X(?:LA|PU)|bf(?:16|loat16)|c(?:10::|omplex(?:128|64)|pu|uda)|d(?:evice\\(type=|ouble)|"
           "f(?:loat|p(?:16|32))|h(?:alf|pu)|int(?:16|32|64|8)|long\\ int|m(?:eta|ps)|npu|on\\ |"
           "to(?:\\ be\\ on\\ |rch\\.)|uint8|x(?:la|pu)")
_START = re.compile(_STARTS)


def dtype_name(text: str) -> str | None:
    """``c10::BFloat16`` / ``Half`` / ``torch.float16`` / ``struct c10::Half`` -> torch dtype name, else None.

    >>> dtype_name("struct c10::Half"), dtype_name("torch.bfloat16"), dtype_name("cuda")
    ('float16', 'bfloat16', None)
    """
    t = text.strip().lower().replace("struct ", "").replace("c10::", "").replace("torch.", "")
    return DTYPES.get(t)


def device_name(text: str) -> str | None:
    """A device as messages spell it -> ``cuda:0`` / ``cpu`` / ``meta`` (bare accelerators get index 0).

    >>> device_name("CUDA"), device_name("GPU"), device_name("mps:1"), device_name("float")
    ('cuda:0', 'cuda:0', 'mps:1', None)
    """
    t = text.strip().lower()
    t = _DEVICE_WORD.get(t, t)
    kind, _, index = t.partition(":")
    if kind in ACCELERATORS:
        return f"{kind}:{index or 0}" if not index or index.isdigit() else None
    return kind if kind in ("cpu", "meta") and not index else None


def type_name(text: str) -> tuple[str | None, str | None]:
    """One type as a conv message prints it -> (device or None, dtype or None).

    >>> type_name("torch.cuda.FloatTensor"), type_name("c10::Half"), type_name("CPUBFloat16Type")
    (('cuda:0', 'float32'), (None, 'float16'), ('cpu', 'bfloat16'))
    >>> type_name("CUDAHalfTensor")
    ('cuda:0', 'float16')
    """
    t = text.strip().replace("struct ", "")
    plain = dtype_name(t)
    if plain:
        return None, plain
    devices, dtypes = _scan(t)
    if not dtypes:  # 2018-era "CUDAFloatTensor" / "CPUHalfTensor": the legacy name without its dots
        m = _DOTLESS.fullmatch(t)
        if m:
            return ("cuda:0" if m.group(1) == "CUDA" else "cpu"), dtype_name(m.group(2))
    return (devices[0] if devices else None), (dtypes[0] if dtypes else None)


_DOTLESS = re.compile(r"(CUDA|CPU)(\w{1,12})Tensor")


def _tokens(text: str) -> Iterator[re.Match[str]]:
    """``_TOKEN.finditer(text)``, tried only where a token can start (``_START``)."""
    search, match = _START.search, _TOKEN.match
    c = search(text)
    while c is not None:
        m = match(text, c.start())
        if m is None:
            c = search(text, c.start() + 1)
        else:
            yield m
            c = search(text, m.end())  # a token is never empty: the next one starts at or after its end


def _scan(text: str) -> tuple[list[str], list[str]]:
    devices: list[str] = []
    dtypes: list[str] = []
    for m in _tokens(text[:_LIMIT]):
        # each match's groups read in one call (a log of errors reads hundreds of messages); one alternative matched
        ldev, ldt, pdev, pdt, rdev, ridx, word, dev, idx, dt = m.groups()
        if ldt:
            dev, dt = ldev or "cpu", ldt
        elif pdt:
            dev, dt = pdev, pdt
        elif rdev:
            dev = rdev + (f":{ridx}" if ridx else "")
        elif word:
            dev = word
        elif dev:
            dev = dev + (f":{idx}" if idx else "")
        else:
            dev = None
        d = device_name(dev) if dev else None
        if d and d not in devices:
            devices.append(d)
        t = dtype_name(dt) if dt else None
        if t is None and dt and dt.lower().startswith("float8"):
            t = dt.lower()
        if t and t not in dtypes:
            dtypes.append(t)
    return devices, dtypes


def names_in(text: str) -> tuple[list[str], list[str]]:
    """``(devices_in(text), dtypes_in(text))`` read in one pass.

    >>> names_in("expected scalar type BFloat16 but found Float on cuda:1")
    (['cuda:1'], ['bfloat16', 'float32'])
    """
    return _scan(text)


def devices_in(text: str) -> list[str]:
    """The devices an error text names, normalised (``cuda:0``, ``cpu``, ``mps:0``, ``xpu:0``, ``meta``), in order of
    first appearance, without repeats.

    >>> devices_in("RuntimeError: Tensor on device meta is not on the expected device cuda:1!")
    ['meta', 'cuda:1']
    >>> devices_in("argument #1 'self' is on CPU, but expected it to be on GPU; torch.cuda.is_available()")
    ['cpu', 'cuda:0']
    """
    return _scan(text)[0]


def dtypes_in(text: str) -> list[str]:
    """The dtypes an error text names, as torch names (``bfloat16``, ``float16``, ``float32``, ``int64`` ...), in
    order of first appearance, without repeats.

    >>> dtypes_in("result type Float can't be cast to the desired output type long int")
    ['float32', 'int64']
    >>> dtypes_in("Expected object of scalar type torch.float16 but got c10::BFloat16 (CUDAHalfType)")
    ['float16', 'bfloat16']
    """
    return _scan(text)[1]


_TRANSFORMERS = re.compile(r"transformers(?:`|\*\*)?(?:==|>=|~=| version:? ?|: ?|-| v| )v?(\d{1,2})\.(\d{1,3})")


def transformers_version(context: str) -> tuple[int, int] | None:
    """The transformers version a log shows (``transformers==4.36.2``, ``- `transformers` version: 4.41.2``).

    >>> transformers_version("- `transformers` version: 4.41.2\\n- Platform: Linux")
    (4, 41)
    >>> transformers_version("site-packages/transformers/modeling_utils.py") is None
    True
    """
    m = _TRANSFORMERS.search(context[:200_000]) if "transformers" in context else None  # its first word, found fast
    return (int(m.group(1)), int(m.group(2))) if m else None


_EDGE = "\\b"  # a rule word's end marked so matches only where no letter or digit touches that side
_PARSED: dict[str, tuple[bool, bool, str]] = {}  # a rule word: (marked at its start, at its end, its core)


def find_word(text: str, word: str, start: int = 0) -> int:
    r"""Where a context rule's ``word`` first occurs in ``text`` from ``start`` (-1: nowhere). A word is a plain
    substring, except at an end marked ``\b``: there no letter or digit may touch it, so a short token is not
    found inside a longer one (``\bamd\b`` is not in the "AMD64" of a Python version line, ``\bmps\b`` is not in
    "timestamps").

    >>> find_word("python 3.10 (amd64)", r"\bamd\b"), find_word("an amd gpu", r"\bamd\b")
    (-1, 3)
    >>> find_word("timestamps: 3", r"\bmps\b"), find_word("slow_conv2d_forward_mps", r"\bmps\b")
    (-1, 20)
    """
    parsed = _PARSED.get(word)
    if parsed is None:
        lead, trail = word.startswith(_EDGE), len(word) > 2 and word.endswith(_EDGE)
        parsed = _PARSED[word] = (lead, trail, word[2 if lead else 0: len(word) - 2 if trail else len(word)])
    lead, trail, core = parsed
    if not (lead or trail):
        return text.find(word, start)
    p = text.find(core, start)
    while p != -1:
        end = p + len(core)
        if (not lead or p == 0 or not text[p - 1].isalnum()) and (not trail or end == len(text)
                                                                   or not text[end].isalnum()):
            return p
        p = text.find(core, p + 1)
    return -1

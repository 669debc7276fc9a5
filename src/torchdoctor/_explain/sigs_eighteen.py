"""Signatures and causes for families the eighteenth collection's first run (session 27, a representative draw of
plain queries) found nothing for, or put second: bitsandbytes unable to load its CUDA library ("CUDA Setup failed
despite GPU being available", "libbitsandbytes_cudaNone.so", "CUDA SETUP: Required library version not found:
libbitsandbytes_cpu.so", its CPU binary loaded where a GPU was wanted), torch's type promotion finding no common
dtype on older releases ("common_dtype_ != ScalarType::Undefined INTERNAL ASSERT FAILED", bfloat16 with another
type); and, weak, where the message is missing: bitsandbytes' CUDA setup named in words ("bitsandbytes CUDA Setup
Failure"), and tensors said in words not to share a device ("the attack does not use the same devices for
tensors", "... is not mapped in the same device of ...").

Every anchor has a key (``prefilter.key_of``). The ``partial.`` signatures are weak (``sigs_frames.WEAK_PREFIXES``):
they speak only where no message does.
"""

from __future__ import annotations

from torchdoctor._explain import causes_device, causes_dtype  # noqa: F401  (causes reused)
from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_DEV, _DT, _NA, _BO = "device_mismatch", "dtype_mismatch", "no_accelerator", "backend_op_missing"

# --- bitsandbytes without its CUDA library --------------------------------------------------------------------------
# bitsandbytes (before 0.43) picks libbitsandbytes_cuda<ver>.so from the CUDA runtime it finds; none found gives
# "libbitsandbytes_cudaNone.so", "CUDA Setup failed despite GPU being available" or the CPU binary with "compiled
# without GPU support" (the Windows wheels of 0.37-0.41 were CPU only)
_sig("no_accel.bnb_cuda_setup", _NA, "bitsandbytes could not load its CUDA library",
     ("cuda setup failed despite gpu", "libbitsandbytes_cudanone", "libbitsandbytes_cpu",
      "required library version not found: libsbitsandbytes", "required library version not found: libbitsandbytes"),
     "bitsandbytes found no CUDA runtime it has a build for[ (it loaded {lib})]: its 8-bit and 4-bit GPU kernels are "
     "not available, whatever torch sees.",
     (("na.bnb_cuda_setup", 3.0), ("na.cpu_build", 0.5)),
     r"(?P<lib>libbitsandbytes_cuda[Nn]one\.\w{2,5})", r"(?P<lib>libs?bitsandbytes_cpu\.\w{2,5})",
     r"CUDA Setup failed despite GPU being available", confidence=0.9,
     alternatives=((_BO, 0.35, "the bitsandbytes build does not match the installed torch or CUDA"),))
_c("na.bnb_cuda_setup",
   "bitsandbytes chose its library from the CUDA runtime it could find: none was on the library path "
   "(LD_LIBRARY_PATH, a conda env without cudatoolkit), the installed bitsandbytes predates this CUDA version, or "
   "the wheel is a CPU-only build (older bitsandbytes wheels for Windows).", "torchdoctor env",
   ("Install a bitsandbytes release with builds for this CUDA (0.43 and later ship them, Windows included)",
    "pip install -U bitsandbytes\npython -m bitsandbytes  # the CUDA setup report"),
   ("Or point it at the CUDA runtime torch uses",
    "export LD_LIBRARY_PATH=$CONDA_PREFIX/lib:$LD_LIBRARY_PATH\nexport BNB_CUDA_VERSION=121  # the runtime's version"))

# --- type promotion without a common dtype (older torch) -----------------------------------------------------------
# torch <= 1.6: the promotion table had no entry for bfloat16 with any other dtype, and TensorIterator asserted
# ("common_dtype_ != ScalarType::Undefined INTERNAL ASSERT FAILED at .../TensorIterator.cpp")
_sig("dtype.no_common_dtype", _DT, "Two dtypes with no common type met in one operation (older PyTorch)",
     ("dtype_ != scalartype",),  # "ScalarType" is CamelCase: the key is read from "dtype_ !="
     "An operation got operands of two dtypes that this torch cannot promote to a common one[ ({what})]: on older "
     "releases bfloat16 (and some complex pairs) had no promotion with other dtypes.",
     (("dt.operand_cast", 2.0), ("dt.input_not_cast", 1.0)),
     r"(?P<what>\w{0,20}dtype_) != ScalarType::Undefined", require_pattern=True, confidence=0.7)

# --- words where the message is missing (weak) ----------------------------------------------------------------------
_sig("partial.bnb_cuda_words", _NA, "bitsandbytes' CUDA setup named as failing (said in words)",
     ("bitsandbytes cuda",),
     "The text names bitsandbytes' CUDA setup or library as failing without its report: bitsandbytes found no CUDA "
     "runtime it has a build for.",
     (("na.bnb_cuda_setup", 3.0),), r"bitsandbytes cuda (?:setup|library)", require_pattern=True, confidence=0.45)
_sig("partial.device_words_apart", _DEV, "Tensors said not to share a device (said in words)",
     ("tensors are not on the same device", "not mapped in the same device", "use the same devices for tensors",
      "not mapped to the same device"),
     "The text says tensors of one operation are not on the same device without PyTorch's own message.",
     (("dev.created_inside", 2.0), ("dev.module_not_moved", 1.0), ("dev.inputs_not_moved", 1.0)), confidence=0.45,
     alternatives=(("mixed_device_model", 0.3, "a model spread over several GPUs"),))

"""torchdoctor for ComfyUI, in one step: put this folder in ``ComfyUI/custom_nodes/`` and install torchdoctor in
ComfyUI's Python by the README's one route, its two lines with ComfyUI's interpreter in place of ``python``::

    python -c "import torch; print('torch==' + torch.__version__)" > torch-pin.txt
    python -m pip install -c torch-pin.txt /path/to/torchdoctor

- Every placement error ComfyUI logs ("!!! Exception during processing !!!" with its traceback) is followed by a
  short explanation and its fix, once per distinct error (the log explainer, installed when ComfyUI loads this pack).
- The node "Placement check (torchdoctor)" (category ``utils/torchdoctor``) takes a MODEL and reports every tensor
  that is not where its load device expects it, by path; the MODEL passes through unchanged.
"""

from .check import PlacementCheck, install_log_explainer

NODE_CLASS_MAPPINGS = {"TorchdoctorPlacementCheck": PlacementCheck}
NODE_DISPLAY_NAME_MAPPINGS = {"TorchdoctorPlacementCheck": "Placement check (torchdoctor)"}

install_log_explainer()

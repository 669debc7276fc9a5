"""App conventions the policy cannot read from a mechanism: plain-object state that an app keeps elsewhere on
purpose. Each row names the app, the versions it was checked against, the attribute and why it is intended.
Only tensors of plain objects (no module owns them) are matched, by an attribute name on their path; the
mechanisms (layers that cast per call, schedule tables, weight backups, forward-replacing LoRA networks) live in
``torchdoctor._scan.apps``. Documented in docs/policy.md."""

from __future__ import annotations

from typing import NamedTuple


class Convention(NamedTuple):
    app: str
    checked: str  # the versions / commits read
    owner: str  # the class that holds it
    attribute: str
    why: str


TABLE: tuple[Convention, ...] = (
    Convention("ComfyUI", "master 2026-02 (comfy/model_patcher.py)", "ModelPatcher", "backup",
               "weights saved before a LoRA patch, on the offload device, restored by unpatch_model"),
    Convention("ComfyUI", "master 2026-02 (comfy/model_patcher.py)", "ModelPatcher", "object_patches_backup",
               "objects replaced by object patches, restored by unpatch_model"),
    Convention("ComfyUI", "master 2026-02 (comfy/model_patcher.py)", "ModelPatcher", "patches",
               "LoRA deltas kept on the offload device and cast to the weight per patch"),
    Convention("ComfyUI", "master 2026-02 (comfy/model_patcher.py)", "ModelPatcher", "backup_buffers",
               "buffers saved before a patch, restored by unpatch_model"),
)

# names LoRA patchers give the weight copies they keep on a module (SD.Next ``network_weights_backup`` /
# ``network_bias_backup``, modules/lora/lora_apply.py at 058a7f0): with the mechanism (shaped like a parameter, never
# read by the module's code) they mark a backup
BACKUP_NAME = r"backup|(^|_)orig(inal)?_(weight|bias)"  # a pattern: re compiles it at first use

__all__ = ["BACKUP_NAME", "Convention", "TABLE"]

"""The plugin a log's traceback runs through: a ComfyUI custom node, a web UI extension (issue 42, point 5).

An app's user fixes a plugin by updating or reporting it, so a diagnosis that says ``git -C custom_nodes/<node>
pull`` while the traceback names ``custom_nodes/ComfyUI-IPAdapter-plus/utils.py:177`` leaves the user to find what
the text already said. The innermost frame inside a plugin folder is the one that ran the failing code (a traceback
lists the outermost call first); its folder, file and line become fields of the diagnosis.

Frames are read as Python prints them (``File ".../custom_nodes/X/utils.py", line 177, in fn``), as rich prints them
(``.../custom_nodes/X/utils.py:177 in fn``) and with Windows separators. Torch-free, linear: one bounded pattern that
starts at the literal folder names.

>>> got = plugin_fields('  File "D:\\\\ComfyUI\\\\custom_nodes\\\\ComfyUI-IPAdapter-plus\\\\utils.py", line 177, in encode')
>>> got["node_dir"], got["plugin_at"], got["ext_dir"]
('custom_nodes/ComfyUI-IPAdapter-plus', 'custom_nodes/ComfyUI-IPAdapter-plus/utils.py:177', 'extensions/<name>')
>>> plugin_fields("no frames")["node_dir"]
'custom_nodes/<node>'
"""

from __future__ import annotations

import re

__all__ = ["plugin_fields"]

# The folders apps load plugins from: ComfyUI's custom_nodes, the web UIs' extensions (AUTOMATIC1111, Forge,
# SD.Next) and their built-in extensions.
_FRAME = re.compile(r"(?P<root>custom_nodes|extensions-builtin|extensions)/(?P<name>[^/\"'\n]{1,120})/"
                    r"(?P<file>[^\"'\n:]{1,300}?\.py)(?:\"?,? line |:)(?P<line>\d{1,7})")
_PLACEHOLDERS = {"node_dir": "custom_nodes/<node>", "ext_dir": "extensions/<name>"}
_READ = 200_000  # characters of context looked at: the frames sit near the error


def plugin_fields(text: str) -> dict[str, str]:
    """Fields naming the innermost plugin frame of ``text`` (``node_dir`` or ``ext_dir``, ``plugin``,
    ``plugin_at``, and the frame's own line as ``plugin_line``), beside placeholders for the folder a fix names
    when no plugin frame is in the text."""
    fields = dict(_PLACEHOLDERS)
    raw = text[-_READ:]
    text = raw.replace("\\", "/") if "\\" in raw else raw  # one character for one: positions hold in raw
    last = None
    for last in _FRAME.finditer(text):
        pass
    if last is None:
        return fields
    root, name = last.group("root"), last.group("name")
    folder = f"{root}/{name}"
    # a built-in extension ships inside the app's own repository: updating it is updating the app ("git -C .")
    fields["node_dir" if root == "custom_nodes" else "ext_dir"] = "." if root == "extensions-builtin" else folder
    fields["plugin"] = name
    fields["plugin_at"] = f"{folder}/{last.group('file')}:{last.group('line')}"
    start = text.rfind("\n", 0, last.start()) + 1
    end = text.find("\n", last.end())
    fields["plugin_line"] = raw[start: end if end != -1 else len(raw)].strip()  # shown as evidence, as written
    return fields

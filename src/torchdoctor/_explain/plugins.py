"""The plugin a log's traceback runs through: a ComfyUI custom node, a web UI extension or script (issue 42,
point 5).

An app's user fixes a plugin by updating or disabling it, so a diagnosis that says ``git -C custom_nodes/<node>
pull`` while the traceback names ``custom_nodes/ComfyUI-IPAdapter-plus/utils.py:177`` leaves the user to find what
the text already said. The innermost frame inside a plugin folder is the one that ran the failing code (a traceback
lists the outermost call first); its folder, file and line become fields of the diagnosis, and ``plugin_fixes``
names the plugin in its update and disable steps, whatever the category.

Frames are read as Python prints them (``File ".../custom_nodes/X/utils.py", line 177, in fn``), as rich prints them
(``.../custom_nodes/X/utils.py:177 in fn``) and with Windows separators. A web UI's own ``scripts/`` folder
(AUTOMATIC1111, Forge, SD.Next: ``webui/scripts/xyz_grid.py``) holds scripts, not packages: a frame there counts
only in a web UI's log (its ``modules/`` frames or folder) and never inside an installed package. Torch-free, linear: bounded
patterns that start at the literal folder names.

>>> got = plugin_fields('  File "D:\\\\ComfyUI\\\\custom_nodes\\\\ComfyUI-IPAdapter-plus\\\\utils.py", line 177, in encode')
>>> got["node_dir"], got["plugin_at"], got["ext_dir"]
('custom_nodes/ComfyUI-IPAdapter-plus', 'custom_nodes/ComfyUI-IPAdapter-plus/utils.py:177', 'extensions/<name>')
>>> [code for _, code in plugin_fixes(got)][0]
'git -C custom_nodes/ComfyUI-IPAdapter-plus pull'
>>> plugin_fields("no frames")["node_dir"], plugin_fixes(plugin_fields("no frames"))
('custom_nodes/<node>', ())
"""

from __future__ import annotations

import re

__all__ = ["plugin_fields", "plugin_fixes"]

# The folders apps load plugins from: ComfyUI's custom_nodes, the web UIs' extensions (AUTOMATIC1111, Forge,
# SD.Next) and their built-in extensions.
# A separator may be doubled: a repr'd or JSON-escaped Windows path left as the log wrote it ("custom_nodes\\\\X").
_FRAME = re.compile(r"(?P<root>custom_nodes|extensions-builtin|extensions)//?(?P<name>[^/\"'\n]{1,120})//?"
                    r"(?P<file>[^\"'\n:]{1,300}?\.py)(?:\"?,? line |:)(?P<line>\d{1,7})")
# a web UI's scripts folder: the script is the file itself (extensions/X/scripts/ is extension X's, above)
_SCRIPT = re.compile(r"(?<=/)scripts/(?P<file>[^/\"'\n:]{1,200}\.py)(?:\"?,? line |:)(?P<line>\d{1,7})")
# a web UI's own frames or folder (lower-cased): where a scripts/ folder holds its scripts
_WEBUI = ("modules/scripts.py", "modules/call_queue.py", "modules/processing.py", "modules/txt2img.py",
          "modules/img2img.py", "webui", "sdnext", "sd.next", "forge")
_PLACEHOLDERS = {"node_dir": "custom_nodes/<node>", "ext_dir": "extensions/<name>"}
_READ = 200_000  # characters of context looked at: the frames sit near the error


def _last(rx: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = None
    for last in rx.finditer(text):
        pass
    return last


# the innermost frame whose code converts a tensor to numpy: 'File "...", line N, in f' and its code line
_NUMPY_AT = re.compile(r'File "(?P<file>[^"\n]{1,300})", line (?P<line>\d{1,7})[^\n]{0,300}\n[ \t]*'
                       r'(?P<code>[^\n]{0,300}\.numpy\(\)[^\n]{0,300})')


def line_fixes(sig_name: str, text: str) -> tuple[tuple[str, str], ...]:
    """A fix written at the line the traceback shows, where the text holds that line: a GPU tensor's
    ``t.numpy()`` there becomes ``t.cpu().numpy()`` (the innermost frame whose code calls ``.numpy()``).

    >>> line_fixes("device.numpy", 'File "n/face.py", line 10, in f\\n    a = image.numpy()')
    (('Copy it to the CPU where the code converts it (face.py:10)', 'a = image.cpu().numpy()  # face.py:10'),)
    """
    if sig_name != "device.numpy":
        return ()
    last = _last(_NUMPY_AT, text[-_READ:])
    if last is None:
        return ()
    code = last.group("code").strip()
    fixed = re.sub(r"(?<!\.cpu\(\))\.numpy\(\)", ".cpu().numpy()", code)
    if fixed == code:
        return ()
    name = re.split(r"[/\\]+", last.group("file"))[-1]
    where = f"{name}:{last.group('line')}"
    return ((f"Copy it to the CPU where the code converts it ({where})", f"{fixed}  # {where}"),)


def _script(text: str) -> re.Match[str] | None:
    """The innermost frame in a web UI's own scripts/ folder, or None (not in a web UI log, or in a package)."""
    if "scripts/" not in text:
        return None
    low = text.lower()
    if not any(w in low for w in _WEBUI):
        return None
    found = None
    for m in _SCRIPT.finditer(text):
        # the path before it on its line (bounded: a line of many "scripts/" must not be read back each time)
        line_start = text.rfind("\n", max(0, m.start() - 400), m.start()) + 1
        before = text[max(line_start, m.start() - 400): m.start()]
        if "packages/" not in before and "extensions" not in before and "custom_nodes/" not in before:
            found = m
    return found


def plugin_fields(text: str) -> dict[str, str]:
    """Fields naming the innermost plugin frame of ``text`` (``node_dir`` or ``ext_dir``, ``plugin``,
    ``plugin_kind``, ``plugin_at``, and the frame's own line as ``plugin_line``), beside placeholders for the folder
    a fix names when no plugin frame is in the text."""
    fields = dict(_PLACEHOLDERS)
    raw = text[-_READ:]
    text = raw.replace("\\", "/") if "\\" in raw else raw  # one character for one: positions hold in raw
    # the pattern starts with one of its folders' names: where neither is in the text (most logs) it is not run
    folder_frame = _last(_FRAME, text) if "custom_nodes" in text or "extensions" in text else None
    script = _script(text)
    if folder_frame is None and script is None:
        return fields
    if script is not None and (folder_frame is None or script.start() > folder_frame.start()):
        name = script.group("file")
        fields.update(plugin=name, plugin_kind="script", ext_dir=".",
                      plugin_at=f"scripts/{name}:{script.group('line')}")
        last = script
    else:
        assert folder_frame is not None
        last = folder_frame
        root, name = last.group("root"), last.group("name")
        folder = f"{root}/{name}"
        kind = {"custom_nodes": "custom node", "extensions": "extension"}.get(root, "built-in extension")
        # a built-in extension ships inside the app's own repository: updating it is updating the app ("git -C .")
        fields["node_dir" if root == "custom_nodes" else "ext_dir"] = "." if kind == "built-in extension" else folder
        file = last.group("file").replace("//", "/")
        fields.update(plugin=name, plugin_kind=kind, plugin_at=f"{folder}/{file}:{last.group('line')}")
    start = text.rfind("\n", 0, last.start()) + 1
    end = text.find("\n", last.end())
    fields["plugin_line"] = raw[start: end if end != -1 else len(raw)].strip()  # shown as evidence, as written
    return fields


def plugin_fixes(fields: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Update and disable steps naming the plugin of ``fields`` (from ``plugin_fields``), or none without one.

    ComfyUI skips a custom node folder whose name ends in ``.disabled``; the web UIs keep the extensions they skip in
    ``config.json``'s ``disabled_extensions`` (the Extensions tab writes it); a script runs only when picked in the
    Script menu.
    """
    name, kind, at = fields.get("plugin"), fields.get("plugin_kind"), fields.get("plugin_at")
    if not name or not kind or not at:
        return ()
    if kind == "custom node":
        folder = fields["node_dir"]
        return ((f"Update the custom node {name}, whose code raised this ({at})", f"git -C {folder} pull"),
                (f"Or disable {name} to confirm it is the cause (ComfyUI skips a folder named *.disabled)",
                 f"mv {folder} {folder}.disabled  # Windows: ren custom_nodes\\{name} {name}.disabled"))
    disable = (f"Or disable {name} to confirm it is the cause (Extensions tab: untick it, Apply and restart UI)",
               f'config.json: "disabled_extensions": ["{name}"]')
    if kind == "extension":
        return ((f"Update the extension {name}, whose code raised this ({at})", f"git -C {fields['ext_dir']} pull"),
                disable)
    if kind == "built-in extension":
        return ((f"Update the web UI: the built-in extension {name} ships with it ({at})", "git -C . pull"), disable)
    return ((f"Update the web UI if {name} is its own script, or the script's source if you added it ({at})",
             "git -C . pull"),
            (f"Or run without {name} to confirm it is the cause", "Script: None  # the Script menu under the prompt"))

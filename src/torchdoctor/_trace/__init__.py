"""``trace``: who moved or cast which tensor, with the call and the source line.

guard and scan ask ``active()`` and ``note_for(tensor_or_path)`` to add the call and line that last moved or cast
a tensor to their messages.
"""

from torchdoctor._trace.api import TraceRecord, active, note_for, record_for, trace

__all__ = ["TraceRecord", "active", "note_for", "record_for", "trace"]

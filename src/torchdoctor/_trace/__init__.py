"""``trace``: who moved or cast which tensor, with the call and the source line."""

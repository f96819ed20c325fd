"""Calling user code safely: its errors, the process-wide state a case can change, the processes it starts."""

"""Files, locks, child processes and the console: what every command needs and no user imports.

Nothing here imports the library above it.
"""

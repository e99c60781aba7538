"""The output folder: its lock, progress markers, dead letters, atomic publishing, retention."""

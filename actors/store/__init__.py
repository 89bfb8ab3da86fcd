"""The broker's durable store: one SQLite file (database), its file and lock (file), the
transmission queue's rows, a group commit's savepoints, checkpoints off the event loop, and the
delivery audit's format. Plain Python: no Ray.
"""

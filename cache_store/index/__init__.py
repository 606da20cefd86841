"""The entity vector index: exact numpy or hnswlib, its checked file format, and the keeper that follows
a change log."""

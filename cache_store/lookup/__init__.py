"""The lookup shared by every backend: the hit rule, the ranking over postings, and the flow from index to donor."""

"""Prompt understanding: spaCy entity extraction, the role of each entity, and the phrase embedders."""

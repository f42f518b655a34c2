"""Answers from documents: the index, its text and matching, grounding the prompt, the persona."""

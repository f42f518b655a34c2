"""Serverless (in-browser) mode: exports the avatar and the neural engine for a static web page."""

"""Language models: the chat API, the embedded SmolLM2 in its supervised process, OpenAI-compatible
clients."""

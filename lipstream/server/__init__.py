"""Server: FastAPI app, WebSocket session protocol, auth, static web client."""

"""Media: H.264/AAC encoding, MP4 muxing, stream packaging."""

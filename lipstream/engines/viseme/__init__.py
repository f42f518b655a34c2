"""The weight-free viseme engine: audio -> articulation -> landmark-driven mouth warp."""

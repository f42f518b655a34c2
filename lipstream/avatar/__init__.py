"""Avatar bundles: prepare (video -> bundle), face tracking, masks, bundle read/write."""

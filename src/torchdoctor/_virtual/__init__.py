"""Virtual devices: ``tensor`` (virtual tensors), ``runtime`` (the device APIs answered), ``simulate`` and ``session`` (the user's own code on virtual devices)."""

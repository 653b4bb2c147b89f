"""The artist inside ComfyUI: :mod:`.questions` asks in the web UI and waits for the answer (the Artist Picks node, the
Train node's questions and checks against the start); :mod:`.taste` runs the taste model in the Train node and loads
a saved one as a reward. The rules they apply are the core's :mod:`treegrpo.artist`."""

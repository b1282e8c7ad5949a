"""What a chip needs of this machine and this process, asked by the chips (``backends/``) and
never naming one: the probe procedure and its bounded calls (``probing``, ``bounded_calls``),
the visible-devices mask and NVIDIA's variables carried to a chip's own (``visible``,
``environment``), a chip's start (``activation``), its memory pool's figures and cap
(``pools``), and the host as the cpu backend's device (``host``)."""

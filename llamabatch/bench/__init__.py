"""`llamabatch bench` as a library: the figures (benchkit.py, trace.py), the generation and
embeddings levels that measure them (generation.py, embed.py), llama-cpp-python's baseline
(baseline.py), the --json document (document.py, report.py) and its renderings as data: rich
tables (tables.py), chart data (chartdata.py), SVG and HTML (svgchart.py, htmlreport.py) and
terminal plots as text (termplot.py). Nothing here prints; `llamabatch bench` is its CLI."""

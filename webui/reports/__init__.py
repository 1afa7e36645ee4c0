"""Reports outside the browser: a self-contained HTML file (inline SVG charts) and its PDF."""

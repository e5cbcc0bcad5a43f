"""`stepcli table`'s output: the rich tables of a terminal (terminal; gpusection for the GPU
section, stacksection for the Python stacks), and JSON, CSV and Markdown for machines and CI.

May import: analyses/ (its result types and wording) and stepcli's shared leaves.
"""

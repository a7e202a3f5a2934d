"""Figures (`plots`), Markdown tables (`tables`) and one-line summaries (`summaries`) drawn from
run records.

May import: measure, triton (its statistics' records) and the foundation modules.
"""

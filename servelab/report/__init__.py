"""Figures (`plots`) and Markdown tables (`tables`) drawn from run records.

May import: measure, triton (its statistics' records) and the foundation modules.
"""

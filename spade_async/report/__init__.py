"""`spade report`: what a run did, as plots (PNG) and one HTML page that holds them.

data.py reads a run's records; curves.py and curriculum.py turn them into numbers; plots.py and
curriculum_plots.py draw one panel each, figures.py lays the panels out into files; summary.py
counts, html.py renders the page and write.py writes it all. Every plot renders, with "no data
yet" where a source is still empty, so a report of a run that has just started is complete too.
"""

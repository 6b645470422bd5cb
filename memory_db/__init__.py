"""Environment memory on LanceDB (issue 4). Must never import spade_async or trainer."""

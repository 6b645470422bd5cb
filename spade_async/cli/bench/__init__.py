"""`spade bench ...`: each command runs a benchmark of spade_async.bench and prints its figures
(or the JSON). The group is assembled in spade_async.cli."""

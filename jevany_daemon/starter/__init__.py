"""The starter model: a small checkpoint trained on the spot on a synthetic decision suite.

suite.py     support tickets whose answers follow from their text: the items, their labels, the split
train.py     training through the engine's own encoding, layout and readout plan
build.py     the run directory: train, write, then measure through the serving path
evaluate.py  accuracy and expected calibration error of decide results against labels
"""

"""The time-series lane (SPEC C10): encoder (encoder.py), horizon predictor (horizon.py), forecaster
(forecaster.py), scores (metrics.py), training and run directories (train.py), offline real series (datasets.py).

scifolio timeseries train --config debug --data series.csv --out out/ts
"""

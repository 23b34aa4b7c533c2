"""The name of a run folder's columnar copy of requests.jsonl (report/columns.py writes it, report/load.py reads it):
one light module both import, so neither imports the other for it."""

COLUMNS_COPY = "requests.columns.parquet"

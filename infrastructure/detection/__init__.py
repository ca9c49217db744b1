"""Detection: calibrated CUSUM charts over the monitor's runs, their false-alarm guarantee, the
detector's statistic over time, and the ledger of open issues."""

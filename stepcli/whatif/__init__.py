"""`stepcli whatif`: a step's dependency graph on every rank, replayed, checked against the measured
step, and replayed again under a change (stepcli.traces.analyses.lanes builds each rank's lane,
stepcli.whatif.lanegraph joins them, stepcli.whatif.lanereplay replays them with
stepcli.whatif.lanetime's account of a lane's time).
"""

"""The figures computed over a trace's columns: what `stepcli table`, the run summary and the report
show.

traceanalysis runs them all for one file and merges files; arrays is the operator tree on typed
arrays (reference, the per-event version it is tested against); steps, device, launches,
collectivestats, flops, ranks and shares each own one figure; arrivals and culprit find the rank
that holds a job back; results holds the result types. stepphases: the host events and the steps'
phases on arrays (for traceanalysis and stepops). May import: read/ and stepcli's shared leaves;
never render/ or anything above traces/.
"""

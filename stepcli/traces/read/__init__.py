"""Reading trace files: bytes -> events -> typed columns, one file on one or several cores.

tracereader decodes Kineto/Chrome JSON (plain or gzip) into events; columns keeps them as typed
columns a slice at a time; splitread and twoprocess read one large file in several processes,
readahead inflates a .gz in a forked child, shortcommand does the same for a short command; files
lists what a folder holds. May import: stepcli's shared leaves and agent.config/agent.tracenames
(the file format); nothing of analyses/ or render/, which build on it.
"""

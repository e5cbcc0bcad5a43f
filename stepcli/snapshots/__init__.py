"""`stepcli memory`: CUDA memory snapshots (torch.cuda.memory._snapshot() pickles) -> what filled
the memory.

Owns reading snapshots safely (snapshotreader: plain data only, never a class; its streaming
decoder: unpickle, its fast path fastentries, opcodes, and history, the columns it fills), replaying
their allocator history (allocatorreplay), the split into parameters / gradients / optimizer state /
activations / other (categories), the figures at the peak or the out-of-memory error
(snapshotfigures), and the terminal and JSON rendering (memoryrender); `memorymain` wires them for
the CLI. Its advice is stepcli.advice.memoryadvice's. May import: stepcli.errors, stepcli.fmt,
stepcli.inputs, stepcli.advice, and the names the agent writes (stepcli.agent.cudamemory: file
names, the step tag). Never run/, compare/, report/ or traces/.
"""

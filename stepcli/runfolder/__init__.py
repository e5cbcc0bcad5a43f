"""The run folder `<out>/.stepcli/<run-id>/`: its layout and file formats (layout), and the readers
of its files.

layout owns every name, suffix, metadata key and schema version of the files `stepcli run` and its
agent write (standard library only: the agent imports it in every profiled process). Beside it, the
readers: finding a folder's runs (runs), the run summary document (summaryfile) and its one
validating loader (summaryread), the step logs (steplogreader) and the whole-run step records
(steprecordreader). Importing the package does nothing (the agent imports layout from it). May
import: the shared leaves; of the agent only its config, signing, output and step-record helpers
(the file formats it writes).
"""

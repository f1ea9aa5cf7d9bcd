"""What each command does, as library calls (the CLI only parses and prints): run a pass, build the typed
results, hand them to the one writer (:func:`vitscope.outputs.write_run`)."""

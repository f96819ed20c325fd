"""The thing checked and its arguments: targets, references, bindings, drawn inputs, devices."""

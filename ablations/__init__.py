"""The bundled study files: `ablate sweep NAME` finds NAME.yaml here."""

"""STAND-IN for MindSpeed (Ascend's Megatron adaptor), used only to test roll-device's glue:
the order of import and repatch and the options passed. It patches nothing and is not MindSpeed."""

EVENTS: list[tuple] = []

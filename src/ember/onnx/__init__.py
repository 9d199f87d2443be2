"""ONNX import: ModelProto -> ember IR (importer), graph clean-up (optimize)."""

from ._native import InfiniGramEngine as InfiniGramEngine

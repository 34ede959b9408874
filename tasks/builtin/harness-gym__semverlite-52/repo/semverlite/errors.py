class InvalidVersion(ValueError):
    def __init__(self, text: object) -> None:
        super().__init__(f"not a semantic version: {text!r}")
        self.text = text

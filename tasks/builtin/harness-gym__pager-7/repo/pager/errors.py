class PageOutOfRange(IndexError):
    def __init__(self, number: int, page_count: int) -> None:
        super().__init__(f"page {number} is out of range 1..{page_count}")
        self.number = number
        self.page_count = page_count

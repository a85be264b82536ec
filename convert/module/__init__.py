"""(being filled: issue 18)"""

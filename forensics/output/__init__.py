"""Output: text for people (rich) and the HTML report page.

Takes the answers' JSON documents and draws them; decides nothing.
"""

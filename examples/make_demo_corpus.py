"""Write the demo's embedded corpus to a folder: no download needed.

  python examples/make_demo_corpus.py OUT_DIR

OUT_DIR/python_docs.txt  Python's own reference text (pydoc_data.topics, shipped with every Python), one
                         section per document, prose only (code and grammar blocks are indented there: dropped).
OUT_DIR/korean.txt       short Korean documents written for this project, so the demo exercises Hangul.
Both are "paragraphs" text: a blank line between documents, sentences still to be split by prepare-corpus.
"""
import re
import sys
from pathlib import Path

KOREAN = [
    # 한글
    "한글은 열네 개의 기본 자음과 열 개의 기본 모음으로 이루어진 문자이다. 자음과 모음을 모아 하나의 음절을 "
    "네모난 글자로 쓰는 것이 큰 특징이다. 그래서 컴퓨터에서는 음절 하나를 한 글자로 다루는 방식과 자모를 따로 "
    "저장하는 방식이 함께 쓰인다. 두 방식을 섞어 쓰면 같은 낱말이 서로 다른 글자로 보일 수 있다. 이런 까닭에 "
    "말뭉치를 만들 때에는 글자를 한 가지 정규형으로 맞추어 두는 것이 좋다.",
    # 계절
    "서울의 봄은 짧지만 화려하다. 사월이 되면 강변을 따라 벚꽃이 피고, 사람들은 점심시간에도 잠깐씩 산책을 "
    "나온다. 여름에는 장마가 길게 이어져 우산을 늘 챙겨야 한다. 가을 하늘은 유난히 높고 맑아서 산에 오르기 "
    "좋다. 겨울에는 바람이 차가워서 따뜻한 국물 요리가 생각난다.",
    # 김장
    "김장은 겨울을 앞두고 온 가족이 모여 김치를 담그는 일이다. 배추를 소금에 절이는 데만 꼬박 하루가 걸린다. "
    "고춧가루와 마늘, 젓갈을 섞은 양념을 배추 잎 사이사이에 고루 바른다. 일을 마치면 갓 담근 김치에 삶은 "
    "돼지고기를 싸 먹는다. 요즘은 김장을 함께 하는 이웃 모임도 많아졌다.",
    # 도서관
    "동네 도서관은 주말 아침에 가장 조용하다. 창가 자리에 앉으면 햇빛이 책장 위로 천천히 옮겨 가는 것이 "
    "보인다. 어린이 열람실에서는 봉사자들이 그림책을 소리 내어 읽어 준다. 빌린 책은 이 주 안에 돌려주어야 "
    "하지만, 한 번은 기한을 늘릴 수 있다. 나는 돌아오는 길에 늘 다음에 읽을 책의 제목을 적어 둔다.",
    # 한강
    "한강은 서울을 동서로 가로질러 흐른다. 강 위에는 서른 개가 넘는 다리가 놓여 있다. 저녁이 되면 다리마다 "
    "조명이 켜져 물 위에 긴 빛의 띠가 생긴다. 강변 공원에서는 자전거를 빌려 탈 수 있다. 여름밤에는 돗자리를 "
    "펴고 바람을 쐬는 사람들로 북적인다.",
    # 프로그래밍
    "프로그래밍을 처음 배울 때에는 작은 문제부터 풀어 보는 것이 좋다. 예를 들어 숫자 목록에서 가장 큰 값을 "
    "찾는 함수를 직접 만들어 볼 수 있다. 코드가 예상대로 움직이지 않으면 값을 하나씩 출력해 보며 원인을 찾는다. "
    "테스트를 먼저 써 두면 고친 코드가 다른 부분을 망가뜨리지 않았는지 바로 알 수 있다. 꾸준히 연습하면 "
    "복잡한 프로그램도 작은 조각으로 나누어 생각하게 된다.",
    # 차
    "녹차는 물을 끓인 뒤 조금 식혀서 우리는 것이 좋다. 너무 뜨거운 물을 부으면 쓴맛이 강해진다. 찻잎은 "
    "이삼 분 정도만 우리고 건져 낸다. 같은 찻잎으로 두세 번 더 우려 마실 수 있다. 차를 마시는 동안에는 "
    "대화도 자연스럽게 느려진다.",
    # 산행
    "우리는 새벽 여섯 시에 산 입구에서 만났다. 처음 한 시간은 완만한 숲길이라 이야기를 나누며 걸었다. "
    "정상 가까이에서는 바위가 많아 손으로 짚으며 올라가야 했다. 정상에 서자 구름 아래로 마을과 논밭이 "
    "내려다보였다. 내려오는 길에 계곡물에 발을 담그니 피로가 싹 풀렸다.",
    # 시장
    "전통 시장에 가면 물건을 사는 재미만큼 구경하는 재미도 크다. 상인들은 손님을 부르며 그날 들어온 "
    "채소와 생선을 자랑한다. 떡집 앞에는 갓 찐 떡의 고소한 냄새가 가득하다. 값을 조금 깎아 달라고 "
    "하면 덤을 얹어 주는 가게도 있다. 장바구니가 무거워질수록 발걸음은 오히려 가벼워진다.",
    # 기차
    "기차 여행은 창밖 풍경이 천천히 바뀌는 것을 볼 수 있어서 좋다. 도시를 벗어나면 논과 산이 번갈아 "
    "나타난다. 역마다 잠깐 멈출 때 사람들이 타고 내리는 모습을 구경한다. 도시락을 펼쳐 먹다 보면 어느새 "
    "목적지에 가까워진다. 도착하면 작은 역 앞 식당에서 그 지역 국수를 꼭 먹어 본다.",
]


def python_doc_sections():
    """(title, prose) per section of every pydoc topic, in a stable order."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        lines = topics[name].splitlines()
        sections, title, body = [], name, []
        for i, line in enumerate(lines):
            underline = i + 1 < len(lines) and re.fullmatch(r"([*=\-~^])\1{2,}", lines[i + 1].strip() or "x")
            if underline and line.strip():
                sections.append((title, body))
                title, body = line.strip(), []
            elif re.fullmatch(r"([*=\-~^])\1{2,}", line.strip() or "x"):
                continue
            else:
                body.append(line)
        sections.append((title, body))
        for title, body in sections:
            paragraphs, current = [], []
            for line in body + [""]:
                if line.strip() and not line.startswith((" ", "\t")):
                    current.append(line.strip())
                elif current:
                    paragraphs.append(" ".join(current))
                    current = []
            # a paragraph ending in ':' introduced a code block we dropped: end it as a sentence instead;
            # one cut off mid-sentence by a code block ("... is equivalent to") is left out
            paragraphs = [p.rstrip(":") + "." if p.endswith(":") else p for p in paragraphs]
            prose = " ".join(p for p in paragraphs if p.endswith((".", "!", "?", ")", '"')))
            if len(prose) > 200:
                yield title, prose


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/make_demo_corpus.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    docs = [prose for _, prose in python_doc_sections()]
    (out / "python_docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    (out / "korean.txt").write_text("\n\n".join(KOREAN) + "\n", encoding="utf-8")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"demo corpus: {len(docs)} Python documentation sections + {len(KOREAN)} Korean documents, "
          f"{size / 1e3:.0f} KB -> {out}")


if __name__ == "__main__":
    main()

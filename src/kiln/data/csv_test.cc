#include "kiln/data/csv.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseCsvTest, SplitsRecordsAndFields) {
  auto rows = ParseCsv("a,b,c\n1,2,3\n", "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].line, 1);
  EXPECT_THAT((*rows)[0].fields, ElementsAre("a", "b", "c"));
  EXPECT_EQ((*rows)[1].line, 2);
  EXPECT_THAT((*rows)[1].fields, ElementsAre("1", "2", "3"));
}

TEST(ParseCsvTest, QuotedFieldsHoldDelimitersQuotesAndNewlines) {
  auto rows = ParseCsv("x,\"a,b\",\"say \"\"hi\"\"\"\n\"two\nlines\",y\nlast,1", "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_THAT((*rows)[0].fields, ElementsAre("x", "a,b", "say \"hi\""));
  EXPECT_EQ((*rows)[1].line, 2);
  EXPECT_THAT((*rows)[1].fields, ElementsAre("two\nlines", "y"));
  EXPECT_EQ((*rows)[2].line, 4);  // the quoted newline counts as a line
  EXPECT_THAT((*rows)[2].fields, ElementsAre("last", "1"));
}

TEST(ParseCsvTest, CrlfLoneCrAndByteOrderMark) {
  auto rows = ParseCsv(
      "\xEF\xBB\xBF"
      "a,b\r\n1,2\r3,4\r\n",
      "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_THAT((*rows)[0].fields, ElementsAre("a", "b"));
  EXPECT_THAT((*rows)[1].fields, ElementsAre("1", "2"));
  EXPECT_THAT((*rows)[2].fields, ElementsAre("3", "4"));
  EXPECT_EQ((*rows)[2].line, 3);
}

TEST(ParseCsvTest, EmptyFieldsAndBlankLines) {
  auto rows = ParseCsv(",,\n\n\"\"\na,,b\n", "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);  // the blank line and the lone "" are skipped
  EXPECT_THAT((*rows)[0].fields, ElementsAre("", "", ""));
  EXPECT_EQ((*rows)[1].line, 4);
  EXPECT_THAT((*rows)[1].fields, ElementsAre("a", "", "b"));
}

TEST(ParseCsvTest, OtherDelimiter) {
  CsvOptions o;
  o.delimiter = ';';
  auto rows = ParseCsv("a;b,c\n", "t.csv", o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT((*rows)[0].fields, ElementsAre("a", "b,c"));
}

TEST(ParseCsvTest, BadRowsNameLineAndColumn) {
  auto unterminated = ParseCsv("a,b\nc,\"open\n", "t.csv");
  ASSERT_FALSE(unterminated.ok());
  EXPECT_THAT(unterminated.status().message(), HasSubstr("t.csv:2:3: unterminated quoted field"));
  auto after = ParseCsv("a\n\"x\"y,z\n", "t.csv");
  ASSERT_FALSE(after.ok());
  EXPECT_THAT(after.status().message(), HasSubstr("t.csv:2:4: text after a closing quote"));
  auto inside = ParseCsv("a\nb\nx\"y\n", "t.csv");
  ASSERT_FALSE(inside.ok());
  EXPECT_THAT(inside.status().message(), HasSubstr("t.csv:3:2: quote inside an unquoted field"));
}

TEST(ParseCsvTest, PlainTrimmedFields) {
  CsvOptions o;
  o.quoting = false;
  o.trim = true;
  auto rows = ParseCsv("  1 ,\t2\r\n \t \n\"3\", 4 \n", "t.csv", o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);  // the whitespace-only line is blank
  EXPECT_THAT((*rows)[0].fields, ElementsAre("1", "2"));
  EXPECT_EQ((*rows)[1].line, 3);
  EXPECT_THAT((*rows)[1].fields, ElementsAre("\"3\"", "4"));  // quotes are plain characters
}

TEST(ParseCsvDoubleTest, WholeFieldOnly) {
  double v = 0;
  EXPECT_TRUE(ParseCsvDouble("+1.5", &v));
  EXPECT_EQ(v, 1.5);
  EXPECT_TRUE(ParseCsvDouble("-2e3", &v));
  EXPECT_EQ(v, -2000);
  EXPECT_TRUE(ParseCsvDouble("inf", &v));
  EXPECT_TRUE(std::isinf(v));
  EXPECT_FALSE(ParseCsvDouble("", &v));
  EXPECT_FALSE(ParseCsvDouble("1x", &v));
  EXPECT_FALSE(ParseCsvDouble(" 1", &v));
  EXPECT_EQ(TrimCsvField(" \t1 \t"), "1");
}

}  // namespace
}  // namespace kiln::data
